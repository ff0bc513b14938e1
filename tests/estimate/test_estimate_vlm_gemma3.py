"""Gemma 3 with images (gemma-3-4b-it at full width cut to 2 decoder layers and 4 SigLIP layers) against the trace of
TRL's SFTTrainer with its vision collator and transformers' Gemma3Processor (estimator/traces/vlm-gemma3.jsonl,
written by `hpcmem validate trace --cases estimator/cases/vlm-gemma3.yaml`; DPO: vlm-gemma3-dpo.yaml): full
fine-tuning and LoRA (all-linear, q_proj/v_proj), checkpointing on and off, one and two 896×896 images per row, and
two LoRA cases of 8,192 tokens where the image mask costs most. And what the geometry, the rules and the tower's terms
are, by hand from transformers' gemma3 and siglip code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.estimate.lora import LoraLayout, lora_layout
from hpcmem.estimate.vision import OPTIMIZER, WEIGHTS, vision_adapters, vision_terms
from hpcmem.estimate.workspaces import tensor_bytes
from hpcmem.job.images import image_geometry
from hpcmem.job.shape import micro_batch, precision
from hpcmem.job.trl_config import build_job
from hpcmem.validate.cases import case_job
from tests.helpers.stored_cases import trace_records

ROOT = Path(__file__).resolve().parents[2]
RECORDS = trace_records(ROOT, "vlm-gemma3")
# DPO and two rows per micro-batch (vlm-gemma3-dpo.yaml, vlm-gemma3-rows.yaml): measured after the SFT matrix, nothing
# fitted to them
DPO = trace_records(ROOT, "vlm-gemma3-dpo", "vlm-gemma3-rows")
FIXTURE = ROOT / "tests" / "fixtures" / "vlm" / "gemma3-4b-width-L2-D4.json"
MAX_PCT = 3.0


def _job(case_id: str):
    case = {**RECORDS, **DPO}[case_id]["case"]
    return case_job({**case, "model_name_or_path": str(ROOT / case["model_name_or_path"])})


def _sft(**kw):
    settings = {"model_name_or_path": str(FIXTURE), "dtype": "bfloat16", "bf16": True, "max_length": 1024,
                "per_device_train_batch_size": 1, "images_per_example": 1, "image_height": 896, "image_width": 896,
                **kw}
    return build_job("sft", settings)[0]


def test_the_matrix_has_every_technique_and_image_count():
    assert len(RECORDS) == 12
    assert {(c["case"].get("use_peft", False), c["case"]["gradient_checkpointing"], c["case"]["images_per_example"])
            for c in RECORDS.values()} >= {(p, g, n) for p in (False, True) for g in (False, True) for n in (1, 2)}


@pytest.mark.parametrize("case_id", sorted(RECORDS) + sorted(DPO))
def test_estimate_within_3_percent_of_the_trace(case_id):
    traced = {**RECORDS, **DPO}[case_id]["traced"]
    estimated = max(tensor_bytes(p) for p in estimate(_job(case_id)).phases)
    assert abs(estimated - traced) <= MAX_PCT / 100 * traced, (estimated, traced)


def test_every_image_becomes_896_square_4096_patches_256_tokens():
    """Gemma3ImageProcessor resizes to image_size × image_size whatever the input (image_processing_gemma3.py, size
    {"height": 896, "width": 896} from the vision config here); 896 / 14 = 64 patches a side; the projector pools 4 × 4
    patches into a token (64 / sqrt(256))."""
    for h, w in ((896, 896), (480, 640), (3000, 200)):
        job = _sft(image_height=h, image_width=w)
        g = image_geometry(job.train, job.model.vision)
        assert (g.resized, g.patches, g.tokens) == ((896, 896), 64 * 64, 256)
    assert job.model.vision.merge_unit == 16


def test_the_tower_is_counted_with_its_pixels_and_states():
    """Full fine-tuning: the tower and projector in bf16 (their parameters by hand: 4 SigLIP layers of width 1152,
    MLP 4304, 14 px patches, 4096 positions, post_layernorm; the projector's [1152, 2560] weight and RMSNorm), AdamW's
    two states in the weights' dtype (2 × the weights in bf16 here), pixel_values fp32 [2, 3, 896, 896]."""
    h, i = 1152, 4304
    layer = 4 * h + 4 * (h * h + h) + 2 * h * i + i + h
    tower = 3 * 14 * 14 * h + h + 4096 * h + 4 * layer + 2 * h
    projector = h * 2560 + h
    job = _sft(images_per_example=2, gradient_checkpointing=True)
    assert (job.model.vision.tower_params, job.model.vision.merger_params) == (tower, projector)
    est = estimate(job)
    first = {c.name: c.bytes for c in est.phases[0].components}
    assert first[WEIGHTS] == 2 * (tower + projector)
    assert first[OPTIMIZER] == 2 * first[WEIGHTS]
    terms = vision_terms(job, precision(job), lora_layout(job))
    assert terms.pixels == 2 * 3 * 896 * 896 * 4
    assert (terms.patches, terms.image_tokens) == (2 * 4096, 2 * 256)


def test_siglip_blocks_save_what_their_modeling_code_keeps():
    """One SigLIP layer with nothing recomputed (full fine-tuning, bf16, CUDA autocast), by hand from
    modeling_siglip.py `SiglipEncoderLayer`, per patch at h = 1152, I = 4304, 16 heads: two LayerNorms (fp32 input
    copy 4h, mean and rstd 8 B, the 16-bit output the next linear keeps 2h — layer_norm1's fp32 output cast by
    q_proj, k_proj and v_proj each, three copies 3 · 2h: autocast caches no activation's cast); attention (q, k and v
    from three Linears 2h each — no fused storage, no rotary — SDPA's output 2h, which out_proj reads as its input,
    fp32 logsumexp per head); the MLP (fc1's output that GELU keeps, GELU's output that fc2 keeps: 2 × 2I)."""
    job = _sft(gradient_checkpointing=False)
    h, i, n = 1152, 4304, 64 * 64
    norms = 2 * (4 * h + 8 + 2 * h) + 2 * 2 * h
    attention = 3 * 2 * h + 2 * h + 4 * 16
    per_patch = norms + attention + 2 * 2 * i
    assert vision_terms(job, precision(job), LoraLayout(enabled=False)).block_full == per_patch * n


def test_lora_reaches_siglip_linears_by_name():
    """peft's all-linear wraps every nn.Linear of the tower (the projector has none: mm_input_projection_weight is a
    Parameter); q_proj/v_proj match SigLIP's self_attn.q_proj and v_proj too (check_target_module_exists: a name
    ending in "." + target), so the tower is adapted, not frozen whole."""
    everything = _sft(use_peft=True, lora_target_modules=["all-linear"])
    assert [x.name for x in vision_adapters(everything, everything.model.vision)] == [
        "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj", "mlp.fc1", "mlp.fc2"]
    qv = _sft(use_peft=True, lora_target_modules=["q_proj", "v_proj"])
    assert [x.name for x in vision_adapters(qv, qv.model.vision)] == ["self_attn.q_proj", "self_attn.v_proj"]


def test_a_text_only_job_counts_the_loaded_tower_and_says_it_is_unused():
    job = _sft(images_per_example=0, image_height=0, image_width=0)
    est = estimate(job)
    assert next(c.bytes for c in est.phases[0].components if c.name == WEIGHTS) == 2 * job.model.vision.num_params
    assert any("text-only job" in w for w in est.warnings)


@pytest.mark.parametrize(("settings", "words"), [
    ({"min_pixels": 3136}, "Gemma3ImageProcessor has no such setting"),
    ({"images_per_example": 5}, "5 × 256 image tokens .* = 1280 > max_length 1024"),
])
def test_what_gemma3_refuses_with_images(settings, words):
    with pytest.raises(SpecError, match=words):
        _sft(**settings)


def test_images_give_the_language_model_a_mask_even_in_one_row():
    """Gemma3Model.forward builds masks from token_type_ids (create_masks_for_vision_model) whenever the processor
    returns them, i.e. whenever a row has images; one unpadded row of text has none. The traced cost at 8,192 tokens:
    the estimate without it was 5.1 % (no checkpointing) and 6.0 % (checkpointing) under the trace, with it +2.0 % and
    -0.2 % (g3-lora-qv-*-1img-8k)."""
    assert micro_batch(_sft()).masked
    assert not micro_batch(_sft(images_per_example=0, image_height=0, image_width=0)).masked
    with_mask = max(tensor_bytes(p) for p in estimate(_job("g3-lora-qv-nogc-1img-8k")).phases)
    assert with_mask > RECORDS["g3-lora-qv-nogc-1img-8k"]["traced"] * 0.97


def test_a_grid_the_projector_cannot_pool_is_refused_for_images(tmp_path):
    """mm_tokens_per_image 100: a 10 × 10 pool of the 64 × 64 grid is no AvgPool2d kernel (64 / 10 is no integer), so
    Gemma3MultiModalProjector's output would not match the processor's 100 image tokens; text-only it loads and runs."""
    cfg = json.loads(FIXTURE.read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "mm_tokens_per_image": 100}))
    with pytest.raises(SpecError, match="cannot pool into mm_tokens_per_image 100"):
        _sft(model_name_or_path=str(tmp_path / "config.json"))
    assert _sft(model_name_or_path=str(tmp_path / "config.json"), images_per_example=0, image_height=0,
                image_width=0).model.vision.tokens_per_image == 100

"""DeepSeek-VL hybrid's parts as hpcmem counts them (hpcmem.models.deepseek_vl_hybrid: the SigLIP tower, the SAM tower
with its necks and projection, the hybrid aligner; the Llama decoder) against `AutoModelForImageTextToText.from_config`
on the meta device, on both cuts of estimator/cases/vlm-deepseek-vl-hybrid.yaml; peft's all-linear targets on that
model; the image tokens and the two pixel sizes transformers' DeepseekVLHybridProcessor makes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate.vision import vision_adapters
from hpcmem.job.images import image_geometry
from hpcmem.models.coverage_vlm import vision_language_reason
from hpcmem.models.deepseek_vl_hybrid import deepseek_vl_hybrid_tower_from_config
from hpcmem.models.resolve import resolve_model
from hpcmem.validate.cases import case_job
from tests.helpers.meta_models import meta_image_text_model, peft_all_linear_targets

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vlm"
CUTS = {(224, 1024): FIXTURES / "deepseek-vl-hybrid-defaults-L1.json",
        (384, 768): FIXTURES / "deepseek-vl-hybrid-defaults-L1-384-768.json"}


def _job(cut: Path, **extra):
    return case_job({"trainer": "sft", "model_name_or_path": str(cut), "max_length": 1024, "images_per_example": 1,
                     "image_height": 480, "image_width": 640, "dtype": "bfloat16", "bf16": True, **extra})


def _name(name: str) -> str | None:
    """A meta model module's name as hpcmem's TowerLinear rows name it (with the layer index): SigLIP's below
    `vision_model.encoder.layers.N.` as `blocks.N.<name>`, SAM's below `high_res_vision_model.vision_encoder.layers.N.`
    as `sam.N.<name>`, the aligner's as `aligner.<name>`; None elsewhere."""
    for prefix, ours in (("model.vision_model.encoder.layers.", "blocks."),
                         ("model.high_res_vision_model.vision_encoder.layers.", "sam."),
                         ("model.aligner.", "aligner.")):
        if name.startswith(prefix):
            return ours + name[len(prefix):]
    return None


def _ours(linears) -> list[str]:
    return sorted(f"blocks.{i}.{x.name}" if x.part == "tower" else f"sam.{i}.{x.name}" if x.part == "sam" else x.name
                  for x in linears for i in range(x.count))


def test_the_towers_by_hand():
    """SamVisionConfig's defaults: a 64 × 64 grid at 1024 px, windows of 14 over the grid padded to 70 (25), layer 2
    global; DeepseekVLHybridAligner: vision_proj 768 → 2048, high_res_vision_proj 4 · 256 → 2048, proj 4096 → 4096;
    every SigLIP patch an image token (224 / 16 = 14, 196)."""
    v = resolve_model(str(CUTS[(224, 1024)])).vision
    assert (v.sam_grid, v.sam_padded, v.sam_windows, v.global_layers) == (64, 70, 25, (2,))
    by_name = {x.name: (x.in_features, x.out_features) for x in v.linears()}
    assert by_name["aligner.vision_proj"] == (768, 2048)
    assert by_name["aligner.high_res_vision_proj"] == (1024, 2048)
    assert by_name["aligner.proj"] == (4096, 4096)
    assert by_name["attn.qkv"] == (768, 2304) and by_name["mlp.lin1"] == (768, 3072)
    assert v.tokens_per_image == 196
    assert resolve_model(str(CUTS[(384, 768)])).vision.tokens_per_image == 576


@pytest.mark.torch
@pytest.mark.parametrize("size", sorted(CUTS))
def test_parts_and_linears_equal_the_meta_model(size):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    cut = CUTS[size]
    model = meta_image_text_model(json.loads(cut.read_text()))
    assert type(model).__name__ == "DeepseekVLHybridForConditionalGeneration"
    spec = resolve_model(str(cut))
    count = {"siglip": 0, "sam": 0, "aligner": 0, "language": 0}
    for name, p in model.named_parameters():
        count["aligner" if ".aligner." in name else "sam" if ".high_res_vision" in name else
              "siglip" if ".vision_model." in name else "language"] += p.numel()
    v = spec.vision
    assert count == {"siglip": v.tower_params - v.sam_params, "sam": v.sam_params, "aligner": v.merger_params,
                     "language": spec.num_params}
    theirs = sorted(n for n in (_name(n) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)) if n)
    assert theirs == _ours(v.linears())
    assert spec.tie_word_embeddings is (model.get_output_embeddings().weight is model.get_input_embeddings().weight)


@pytest.mark.torch
def test_peft_all_linear_reaches_what_the_spec_adapts():
    """peft's all-linear (peft/tuners/tuners_utils.py `_maybe_include_all_linear_layers`: every nn.Linear but the
    output embedding): its SigLIP, SAM and aligner targets are hpcmem's `vision_adapters`."""
    pytest.importorskip("torch")
    pytest.importorskip("peft")

    cut = CUTS[(224, 1024)]
    model = meta_image_text_model(json.loads(cut.read_text()))
    targets = peft_all_linear_targets(model)
    theirs = sorted(n for n in (_name(t) for t in targets) if n)
    job = _job(cut, use_peft=True, lora_target_modules="all-linear")
    assert theirs == _ours(vision_adapters(job, job.model.vision))
    assert "lm_head" not in targets


@pytest.mark.torch
@pytest.mark.parametrize("size", sorted(CUTS))
def test_the_processor_makes_the_spec_s_tokens_and_both_sizes(size):
    """DeepseekVLHybridProcessor (hpcmem.trace.vision `processor`, transformers' own class) on one 480×640 image:
    num_image_tokens image tokens and nothing around them, pixel_values at SigLIP's size and high_res_pixel_values at
    SAM's, whatever the image's size (DeepseekVLHybridImageProcessorPil resizes the longest edge and pads)."""
    pytest.importorskip("transformers")
    from PIL import Image
    from transformers.models.deepseek_vl_hybrid.processing_deepseek_vl_hybrid import DeepseekVLHybridProcessor

    from hpcmem.trace.vision import processor

    job = _job(CUTS[size])
    proc = processor(job)
    assert isinstance(proc, DeepseekVLHybridProcessor)
    out = proc(text=[proc.image_token + " t3"], images=[[Image.new("RGB", (640, 480))]], return_tensors="pt")
    ids = out["input_ids"][0]
    tokens = image_geometry(job.train, job.model.vision).tokens
    assert int((ids == proc.image_token_id).sum()) == tokens == {224: 196, 384: 576}[size[0]]
    assert len(ids) == tokens + 1
    assert tuple(out["pixel_values"].shape[-2:]) == (size[0], size[0])
    assert tuple(out["high_res_pixel_values"].shape[-2:]) == (size[1], size[1])


def test_estimated_not_refused():
    assert vision_language_reason("deepseek_vl_hybrid") is None


def test_the_pooling_head_is_refused_with_images(tmp_path):
    """SiglipVisionConfig's default vision_use_head runs the attention-pooling head, whose output
    get_image_features never reads (as DeepSeek-VL's): refused with images, as there."""
    cfg = json.loads(CUTS[(224, 1024)].read_text())
    cfg["vision_config"]["vision_use_head"] = True
    path = tmp_path / "head.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(SpecError, match="vision_use_head true with deepseek_vl_hybrid images"):
        _job(path)


def test_a_global_index_outside_the_tower_is_refused():
    """DeepseekVLHybridModel.get_high_res_image_features reads hidden_states[global_attn_indexes[0] + 1]: a 2-layer
    SAM tower with the default indexes (2, 5, 8, 11) has no such layer."""
    cfg = json.loads(CUTS[(224, 1024)].read_text())
    cfg["high_res_vision_config"]["num_hidden_layers"] = 2
    with pytest.raises(SpecError, match="global_attn_indexes names no layer"):
        deepseek_vl_hybrid_tower_from_config(cfg, "cut")

"""LFM2-VL SFT with images on a learned text part (tests/fixtures/vlm/lfm2-vl-L2-D2.json: one LFM2 short-convolution
and one attention layer of Lfm2Config's widths, their terms from hpcmem/profiles/lfm2-9cb0292d9765bdfe.json; 2
SigLIP2 layers, tiles padded to 1,024 rows) against the trace of TRL's SFTTrainer with its vision collator and
Lfm2VlProcessor on blank 384×768 and 1024×1024 images (estimator/traces/vlm-lfm2-vl.jsonl, written by `hpcmem
validate trace --cases estimator/cases/vlm-lfm2-vl.yaml`); post_layernorm's and the projector's saved tensors, the
padding mask's bias and the model output's forward-only tensors by hand; what is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.estimate.lora import lora_layout
from hpcmem.estimate.vision_llava import llava_terms, tower_terms
from hpcmem.job.shape import precision
from hpcmem.validate.cases import case_job
from tests.helpers.stored_cases import assert_learned_case_holds, grpo_with_images_job, trace_records

ROOT = Path(__file__).resolve().parents[2]
RECORDS = trace_records(ROOT, "vlm-lfm2-vl")
CUT = "tests/fixtures/vlm/lfm2-vl-L2-D2.json"


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    assert_learned_case_holds(RECORDS[case_id], ROOT)


def test_the_matrix_is_all_there():
    assert len(RECORDS) == 8 + 2
    assert {(r["case"]["image_height"], r["case"]["image_width"]) for r in RECORDS.values()} == {(384, 768),
                                                                                               (1024, 1024)}


def _job(height: int = 384, width: int = 768, **kw):
    return case_job({"trainer": "sft", "model_name_or_path": str(ROOT / CUT), "max_length": 2048,
                     "images_per_example": 1, "image_height": height, "image_width": width, "dtype": "bfloat16",
                     "bf16": True, "per_device_train_batch_size": 1, **kw})


def test_post_layernorm_and_the_projector_keep_by_hand():
    """Full fine-tuning, one 384×768 image: one tile of 1,024 rows (968 patches, padded), 256 projector slots, bf16
    under autocast. Siglip2VisionModel.post_layernorm over 768 keeps its input cast to fp32 and fp32 mean and rstd
    (its output feeds the gather, no linear), the gather its int64 index: 4 · 768 + 8 + 8 bytes a tower row.
    Lfm2VlMultiModalProjector: layer_norm over 3072 keeps its fp32 input (pixel_unshuffle's copy), mean and rstd,
    and linear_1 its bf16 output; GELU keeps linear_1's [256, 2560] output, linear_2 GELU's; the boolean index its
    [256] mask: (4 · 3072 + 8 + 2 · 3072 + 2 · 2 · 2560 + 1) bytes a slot."""
    job = _job(gradient_checkpointing=True)
    terms = tower_terms(job, precision(job), lora_layout(job))
    assert terms.merger_saved == 1024 * (4 * 768 + 8 + 8) + 256 * (4 * 3072 + 8 + 2 * 3072 + 2 * 2 * 2560 + 1)


@pytest.mark.parametrize(("height", "width", "bias"), [(384, 768, 2 * 1 * 1024 ** 2), (1024, 1024, 0)])
def test_the_padding_mask_s_bias_by_hand(height, width, bias):
    """A block keeps SDPA's bf16 additive bias [tiles, 1, 1024, 1024] where a tile is padded (384×768: 968 of 1,024
    rows) beyond llava's blocks, which keep none however many tiles are rows, and none where no tile is (1024×1024:
    five full tiles)."""
    job = _job(height, width, gradient_checkpointing=False)
    prec, lora = precision(job), lora_layout(job)
    assert tower_terms(job, prec, lora).block_full - llava_terms(job, prec, lora).block_full == bias


def test_the_model_output_holds_the_tower_s_output_through_the_forward():
    """Lfm2VlModelOutputWithPast.image_outputs: last_hidden_state [1, 1024, 768] fp32 (post_layernorm under
    autocast) and pooler_output, the 242 image tokens' [242, 2560] bf16 rows."""
    job = _job(gradient_checkpointing=True)
    assert tower_terms(job, precision(job), lora_layout(job)).forward_only == 4 * 768 * 1024 + 2 * 2560 * 242


def test_the_patch_embedding_s_adapter_trains():
    """LoRA all-linear wraps the patch embedding (an nn.Linear(768, 768)) besides the layers' and projector's
    linears: its r · (768 + 768) parameters get fp32 gradients."""
    job = _job(use_peft=True, lora_target_modules=["all-linear"], gradient_checkpointing=True)
    v, r = job.model.vision, job.train.lora_r
    terms = tower_terms(job, precision(job), lora_layout(job))
    adapters = sum(r * (x.in_features + x.out_features) * x.count for x in v.linears())
    assert terms.gradients == 4 * adapters


def test_grpo_with_images_is_refused():
    """DPO with images holds (the stored DPO traces above); GRPO and RLOO with images are not traced: refused."""
    with pytest.raises(SpecError, match="with trainer grpo on lfm2_vl: hpcmem models lfm2_vl's images for "
                                         "sft, dpo only"):
        estimate(grpo_with_images_job(ROOT / CUT, 384, 768))
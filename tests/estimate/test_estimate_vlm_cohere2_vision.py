"""Cohere2 Vision SFT with images on a learned text part (tests/fixtures/vlm/cohere2-vision-L2-D2-512.json: 2 Cohere2
layers of Cohere2Config's widths, their terms from hpcmem/profiles/cohere2-9874c62f4dd7f2bb.json; 2 SigLIP layers at
512 px) against the trace of TRL's SFTTrainer with its vision collator and transformers' Cohere2VisionProcessor on
blank 512×512 and 512×1024 images (estimator/traces/vlm-cohere2-vision.jsonl, written by `hpcmem validate trace
--cases estimator/cases/vlm-cohere2-vision.yaml`); post_layernorm's and the projector's saved tensors by hand; what
is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.estimate.lora import lora_layout
from hpcmem.estimate.vision_llava import tower_terms
from hpcmem.job.shape import precision
from hpcmem.validate.cases import case_job
from tests.helpers.stored_cases import assert_learned_case_holds, grpo_with_images_job, trace_records

ROOT = Path(__file__).resolve().parents[2]
RECORDS = trace_records(ROOT, "vlm-cohere2-vision")
CUT = "tests/fixtures/vlm/cohere2-vision-L2-D2-512.json"


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    assert_learned_case_holds(RECORDS[case_id], ROOT)


def test_the_matrix_is_all_there():
    assert len(RECORDS) == 8 + 2
    assert {r["case"]["image_width"] for r in RECORDS.values()} == {512, 1024}


def _job(**kw):
    return case_job({"trainer": "sft", "model_name_or_path": str(ROOT / CUT), "max_length": 1024,
                     "images_per_example": 1, "image_height": 512, "image_width": 1024, "dtype": "bfloat16",
                     "bf16": True, "per_device_train_batch_size": 1, **kw})


def test_post_layernorm_and_the_projector_keep_by_hand():
    """Full fine-tuning, one row, 3 tiles → 3 · 1024 = 3072 tower rows and 768 projector rows, bf16 under autocast.
    SiglipVisionModel.post_layernorm over 1152 keeps its input cast to fp32 and fp32 mean and rstd, and linear_1
    keeps its input, pixel_shuffle's bf16 copy of the LayerNorm's output ([768, 4608], the same bytes as [3072, 1152]):
    4 · 1152 + 8 + 2 · 1152 bytes a tower row. Cohere2VisionMultiModalProjector: linear_1's [768, 36864] output
    (SiLU's input is a view of it), SiLU's [768, 18432] output, linear_2's [768, 18432] input: 2 · (36864 + 18432 +
    18432) bytes a projector row. No LayerNorm over 4 · 1152 (Aya Vision's)."""
    job = _job(gradient_checkpointing=True)
    terms = tower_terms(job, precision(job), lora_layout(job))
    assert terms.merger_saved == 3072 * (4 * 1152 + 8 + 2 * 1152) + 768 * 2 * (36864 + 18432 + 18432)


def test_post_layernorm_trains_and_no_hidden_state_is_recorded():
    """Full fine-tuning: every tower parameter gets a gradient (post_layernorm's 2 · 1152 too: last_hidden_state is
    read) — bf16 gradients of the tower and projector; no layer output is held for `hidden_states` (the forward-only
    term llava's reading has under autocast without checkpointing)."""
    job = _job(gradient_checkpointing=False)
    v = job.model.vision
    terms = tower_terms(job, precision(job), lora_layout(job))
    assert terms.gradients == 2 * (v.tower_params + v.merger_params)
    assert terms.forward_only == 0


def test_grpo_with_images_is_refused():
    """DPO with images holds (the stored DPO traces above); GRPO and RLOO with images are not traced: refused."""
    with pytest.raises(SpecError, match="with trainer grpo on cohere2_vision: hpcmem models cohere2_vision's images for "
                                         "sft, dpo only"):
        estimate(grpo_with_images_job(ROOT / CUT, 512, 512))
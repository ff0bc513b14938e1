"""Aya Vision SFT with images on a learned text part (tests/fixtures/vlm/aya-vision-L2-D2-364.json: 2 Cohere2 layers of
Cohere2Config's widths, their terms from hpcmem/profiles/cohere2-9874c62f4dd7f2bb.json; 2 SigLIP layers at 364 px)
against the trace of TRL's SFTTrainer with its vision collator and transformers' AyaVisionProcessor on blank 364×364
and 364×728 images (estimator/traces/vlm-aya-vision.jsonl, written by `hpcmem validate trace --cases
estimator/cases/vlm-aya-vision.yaml`); the projector's saved tensors by hand; what is refused."""

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
RECORDS = trace_records(ROOT, "vlm-aya-vision")
CUT = "tests/fixtures/vlm/aya-vision-L2-D2-364.json"


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    assert_learned_case_holds(RECORDS[case_id], ROOT)


def test_the_matrix_is_all_there():
    assert len(RECORDS) == 8 + 2


def _job(**kw):
    return case_job({"trainer": "sft", "model_name_or_path": str(ROOT / CUT), "max_length": 1024,
                     "images_per_example": 1, "image_height": 364, "image_width": 728, "dtype": "bfloat16",
                     "bf16": True, "per_device_train_batch_size": 1, **kw})


def test_the_projector_keeps_by_hand():
    """Full fine-tuning, one row, 3 tiles → 507 projector rows, bf16 under autocast: LayerNorm over 4608 keeps its
    input cast to fp32, fp32 mean and rstd, and its output for linear_1 (4 · 4608 + 8 + 2 · 4608 bytes a row); linear_1's [507, 8192] output (SiLU's input
    is a view of it), SiLU's [507, 4096] output, linear_2's [507, 4096] input: 2 · (8192 + 4096 + 4096) bytes a row."""
    job = _job(gradient_checkpointing=True)
    prec = precision(job)
    terms = tower_terms(job, prec, lora_layout(job))
    assert terms.merger_saved == 507 * (4 * 4608 + 8 + 2 * 4608) + 507 * 2 * (8192 + 4096 + 4096)


def test_grpo_with_images_is_refused():
    """DPO with images holds (the stored DPO traces above); GRPO and RLOO with images are not traced: refused."""
    with pytest.raises(SpecError, match="with trainer grpo on aya_vision: hpcmem models aya_vision's images for "
                                         "sft, dpo only"):
        estimate(grpo_with_images_job(ROOT / CUT, 364, 364))
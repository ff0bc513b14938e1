"""Granite 4 Vision SFT and DPO with images on a learned Granite text part
(tests/fixtures/vlm/granite4-vision-released-L8-D4.json: Granite4VisionTextConfig's widths cut to 8 layers, their terms
from the learned profile in hpcmem/profiles/; the released checkpoints' SigLIP tower cut to 4 layers under eight
Window Q-Former projectors) against the trace of TRL's SFTTrainer and DPOTrainer with their vision collators and
transformers' Granite4VisionProcessor on blank 384×384 and 896×672 images (estimator/traces/vlm-granite4-vision.jsonl,
written by `hpcmem validate trace --cases estimator/cases/vlm-granite4-vision.yaml --reserved`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.estimate.lora import LoraLayout
from hpcmem.estimate.vision_granite4_vision import projector_saved
from hpcmem.job.shape import Precision
from hpcmem.validate.cases import case_job
from tests.helpers.stored_cases import assert_learned_case_holds, grpo_with_images_job, trace_records

ROOT = Path(__file__).resolve().parents[2]
RECORDS = trace_records(ROOT, "vlm-granite4-vision")
CUT = "tests/fixtures/vlm/granite4-vision-released-L8-D4.json"


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    assert_learned_case_holds(RECORDS[case_id], ROOT)


def test_the_matrix_is_all_there():
    assert len(RECORDS) == 8 + 4
    assert {(r["case"]["image_height"], r["case"]["image_width"]) for r in RECORDS.values()} == {(384, 384),
                                                                                               (672, 896)}
    assert {r["cell"] for r in RECORDS.values()} == {f"{t}/{c}" for t in ("sft", "dpo")
                                                     for c in ("full+gc", "full+nogc", "lora+gc", "lora+nogc")}


def test_one_spatial_projector_by_hand():
    """One spatial projector, full fine-tuning without checkpointing, on one 384 × 384 image: 2 tiles of 576 patch
    rows (n = 1,152), 2 · 9 windows of 16 queries (r = 288 rows), width 1152, MLP 3072, 18 heads, autocast bf16:
    - `norm`: the fp32 upcast and the statistics, (4 · 1152 + 8) · n; the encoder rows' dropout mask, 1152 · n;
    - the Q-Former's layernorm (4 · 1152 + 8) · r and its dropout mask 1152 · r;
    - self-attention: query/key/value's bf16 cast inputs 3 · 2 · 1152 · r, SDPA's q, k, v, out 4 · 2 · 1152 · r, its
      fp32 logsumexp 4 · 18 windows · 18 heads · 16, the dropout mask 1152 · r, the LayerNorm's fp32 sum and
      statistics (4 · 1152 + 8) · r;
    - cross-attention: query's cast input 2 · 1152 · r, the bf16 encoder rows 2 · 1152 · n (key's and value's
      input), SDPA's q and out 2 · 2 · 1152 · r, k and v 2 · 2 · 1152 · n, logsumexp, mask, LayerNorm;
    - the query MLP: intermediate's cast input 2 · 1152 · r, GELU's input and output_query's input 2 · 2 · 3072 · r,
      mask, LayerNorm;
    - before out_linear: the dropout mask 1152 · r and out_linear's cast input 2 · 1152 · r."""
    job = case_job({**RECORDS["g4v-full-nogc-384"]["case"], "model_name_or_path": str(ROOT / CUT)})
    prec = Precision(weight=2, act=2, residual=2, autocast=False, amp=True)
    n, r, h = 1152, 288, 1152
    ln_r = (4 * h + 8) * r
    lse = 4 * 18 * 18 * 16
    by_hand = ((4 * h + 8) * n + h * n + ln_r + h * r
               + 3 * 2 * h * r + 4 * 2 * h * r + lse + h * r + ln_r
               + 2 * h * r + 2 * h * n + 2 * 2 * h * r + 2 * 2 * h * n + lse + h * r + ln_r
               + 2 * h * r + 2 * 2 * 3072 * r + h * r + ln_r
               + h * r + 2 * h * r)
    assert by_hand == 33_126_912
    assert projector_saved(job, job.model.vision, n, prec, LoraLayout(enabled=False), layerwise=False) == by_hand
    # a layerwise projector's area downsampling (adaptive_avg_pool2d) keeps norm's fp32 output besides
    assert projector_saved(job, job.model.vision, n, prec, LoraLayout(enabled=False), layerwise=True) == \
        by_hand + 4 * h * n


def test_grpo_with_images_is_refused():
    """SFT and DPO with images hold (the stored traces above); GRPO and RLOO with images are not traced: refused."""
    with pytest.raises(SpecError, match="with trainer grpo on granite4_vision: hpcmem models granite4_vision's "
                                        "images for sft, dpo only"):
        estimate(grpo_with_images_job(ROOT / CUT, 384, 384))

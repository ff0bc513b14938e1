"""Molmo2 SFT and DPO with images on a learned text part (tests/fixtures/vlm/molmo2-defaults-L2-D2.json: two
molmo2_text layers of the text config class's widths, their terms from the learned profile in hpcmem/profiles/;
Molmo2VisionConfig's ViT cut to 2 layers under the pooling adapter) against the trace of TRL's SFTTrainer and
DPOTrainer with their vision collators and transformers' Molmo2Processor on blank 640×480 and 896×672 images
(estimator/traces/vlm-molmo2.jsonl, written once by `hpcmem validate trace --cases estimator/cases/vlm-molmo2.yaml
--reserved --workers 1`, the estimate untouched after). The traces ran the real Molmo2ForConditionalGeneration.forward
in training, which raises without mm_token_type_ids: TRL's vision collators passed the processor's on."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.estimate.lora import LoraLayout
from hpcmem.estimate.vision_molmo2 import connector
from hpcmem.job.shape import Precision
from hpcmem.validate.cases import case_job
from tests.helpers.stored_cases import assert_learned_case_holds, grpo_with_images_job, trace_records

ROOT = Path(__file__).resolve().parents[2]
RECORDS = trace_records(ROOT, "vlm-molmo2")
# four images a row (estimator/cases/vlm-molmo2-images4.yaml): the tower's and adapter's share of the peak larger
RECORDS4 = trace_records(ROOT, "vlm-molmo2-images4")
CUT = "tests/fixtures/vlm/molmo2-defaults-L2-D2.json"


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    assert_learned_case_holds(RECORDS[case_id], ROOT)


@pytest.mark.parametrize("case_id", sorted(RECORDS4))
def test_four_images_a_row_within_3_percent_of_the_trace(case_id):
    assert len(RECORDS4) == 2 and RECORDS4[case_id]["case"]["images_per_example"] == 4
    assert_learned_case_holds(RECORDS4[case_id], ROOT)


def test_the_matrix_is_all_there():
    assert len(RECORDS) == 8 + 4
    assert {(r["case"]["image_height"], r["case"]["image_width"]) for r in RECORDS.values()} == {(480, 640),
                                                                                               (672, 896)}
    assert {r["cell"] for r in RECORDS.values()} == {f"{t}/{c}" for t in ("sft", "dpo")
                                                     for c in ("full+gc", "full+nogc", "lora+gc", "lora+nogc")}


def test_the_adapter_keeps_its_windows_attention_and_gated_mlp():
    """modeling_molmo2.py `Molmo2Adapter.forward` on the 640×480 picture's m = 725 windows of k = 4 patches, the
    features 2 · 1152 = 2304 wide, bf16: the gather's int64 indices (8 B), the validity mask `mul` keeps (2 B a
    patch), SDPA's q and output [m, 1152] and k, v [m · k, 1152], its fp32 logsumexp [m, 16 heads], the boolean mask
    [m, 1, 1, k]; SiLU's input and the product's two factors [m, 18944]. Trained, besides: q_proj's input [m, 2304],
    k_proj's / v_proj's [m · k, 2304], o_proj's and gate/up_proj's [m, 1152], down_proj's [m, 18944]."""
    job = case_job({**RECORDS["molmo2-full-nogc-640"]["case"], "model_name_or_path": str(ROOT / CUT)})
    prec = Precision(weight=2, act=2, residual=2, autocast=False, amp=True)
    m, k = 725, 4
    frozen = m * k * 8 + m * k * 2 + 2 * 1152 * (2 * m + 2 * m * k) + 4 * m * 16 + m * k + 3 * 2 * 18944 * m
    trained = frozen + 2 * 2304 * (m + m * k) + 2 * 2 * 1152 * m + 2 * 18944 * m
    conn, held = connector(job, prec, LoraLayout(enabled=False))
    assert conn.saved == trained
    # pixel_values fp32 [5 crops, 729, 588] and image_token_pooling int64 [725, 4]
    assert conn.pixels == 5 * 729 * 588 * 4 + m * k * 8
    # without checkpointing the hidden_states tuple holds the embeddings' output and both layers' [3,645, 1152]
    assert held == 3 * 2 * 1152 * 3645
    # layer 0's slice of the concatenated features' gradient waits through layer 1's backward: the buffer less the
    # slice layer 1 takes
    assert conn.waiting == 2 * 1152 * 3645
    lora_job = case_job({**RECORDS["molmo2-lora-all-nogc-640"]["case"], "model_name_or_path": str(ROOT / CUT)})
    lora_conn = connector(lora_job, prec, LoraLayout(enabled=True, r=16))[0]
    assert lora_conn.saved > frozen and lora_conn.trainable == 16 * (
        3 * (2304 + 1152) + (1152 + 1152) + 2 * (1152 + 18944) + (18944 + 4096))     # beyond: the adapters' own


def test_text_rows_are_refused():
    """Molmo2Model.forward requires mm_token_type_ids in training; TRL's text collators make none."""
    with pytest.raises(SpecError, match="images_per_example 0 on molmo2: Molmo2Model.forward requires "
                                        "mm_token_type_ids"):
        estimate(case_job({"trainer": "sft", "model_name_or_path": str(ROOT / CUT), "dtype": "bfloat16",
                           "bf16": True, "max_length": 2048, "images_per_example": 0}))


def test_pixel_bounds_are_refused():
    """Molmo2ImageProcessor crops fixed 378² views; it has no min_pixels / max_pixels."""
    with pytest.raises(SpecError, match="min_pixels/max_pixels with molmo2: Molmo2ImageProcessor has no such"):
        estimate(case_job({"trainer": "sft", "model_name_or_path": str(ROOT / CUT), "dtype": "bfloat16",
                           "bf16": True, "max_length": 2048, "images_per_example": 1, "image_height": 480,
                           "image_width": 640, "max_pixels": 100_000}))


def test_grpo_with_images_is_refused():
    """SFT and DPO with images hold (the stored traces above); GRPO and RLOO with images are not traced: refused."""
    with pytest.raises(SpecError, match="with trainer grpo on molmo2: hpcmem models molmo2's images for sft, dpo "
                                        "only"):
        estimate(grpo_with_images_job(ROOT / CUT, 480, 640))

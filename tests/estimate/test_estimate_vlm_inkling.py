"""Inkling SFT and DPO with images on a learned text part (tests/fixtures/vlm/inkling-defaults-L2-D2.json: two
inkling_text layers of the text config class's widths, a sliding-window one and a full-attention one, 256 routed
experts each, their terms from the learned profile in hpcmem/profiles/; InklingVisionConfig's hierarchical-MLP tower
at 6 layers, the idle audio embedding) against the trace of TRL's SFTTrainer and DPOTrainer with their vision
collators and transformers' InklingProcessor around hpcmem.trace.vision_inkling's numpy stand-in for its
torchvision-only image processor, on blank 640×640 (16 × 17 patches) and 960×1280 (24 × 33) images
(estimator/traces/vlm-inkling.jsonl, written by `hpcmem validate trace --cases estimator/cases/vlm-inkling.yaml`), and
their text-only twins (estimator/traces/vlm-inkling-text.jsonl), which isolate the image path. Every case holds within
3 % (estimator/LOG.md); the image path was held out as first traced; the DPO reference pass's layer instant is the
learned no-grad pass's, learned after the first trace (in-sample: hpcmem.estimate.learned `no_grad_layer_peak`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.validate.cases import case_job
from tests.helpers.stored_cases import assert_learned_case_holds, grpo_with_images_job, largest_component, trace_records

ROOT = Path(__file__).resolve().parents[2]
RECORDS = trace_records(ROOT, "vlm-inkling")
# the same cells traced without images (estimator/cases/vlm-inkling-text.yaml): the 256-expert text part holds all but
# 0.2 .. 0.6 % of every image case's peak, so the image path is read as a case's difference from its twin
TWINS = trace_records(ROOT, "vlm-inkling-text")
CUT = "tests/fixtures/vlm/inkling-defaults-L2-D2.json"


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    assert_learned_case_holds(RECORDS[case_id], ROOT)


@pytest.mark.parametrize("case_id", sorted(TWINS))
def test_the_text_only_twins_within_3_percent_of_their_trace(case_id):
    assert_learned_case_holds(TWINS[case_id], ROOT)


def _estimated(record: dict) -> int:
    return estimate(case_job({**record["case"]})).peak_allocated_bytes


def _twin(case_id: str) -> dict:
    return TWINS["inkling-text-" + case_id.removeprefix("inkling-").rsplit("-", 1)[0]]


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_the_image_path_against_the_text_only_twin(case_id):
    """A case's peak less its text-only twin's, estimated and traced (the tower's saved tensors, gradients and
    optimizer states, pixel_values, the features, and under LoRA without checkpointing layer 0's input gradient
    terms; 0.2 .. 1.3 GiB): within 2 %."""
    record, twin = RECORDS[case_id], _twin(case_id)
    traced = record["traced"] - twin["traced"]
    assert abs(_estimated(record) - _estimated(twin) - traced) <= 0.02 * traced


def test_a_layer_s_saved_tensors_by_hand():
    """Full fine-tuning at 640×640: 16 rows × (640 // 40 + 1 =) 17 columns = 272 patches. Layer 1 folds each 5 × 5
    block of the pixel rung (75 values) and projects to 128 channels: 2 · 8 · 8 = 128 positions a patch, 34,816 rows.
    Per row: the projection's bf16 input 2 · 75 = 150, the RMSNorm's fp32 copy 4 · 128 = 512 and rsqrt 4, its bf16
    normalised rows 2 · 128 = 256 (the weight trains), GELU's bf16 input 256: 1,178 bytes, 41,013,248 in all."""
    from hpcmem.estimate.lora import LoraLayout
    from hpcmem.estimate.vision_inkling import inkling_terms
    from hpcmem.job.shape import precision

    job = case_job({**RECORDS["inkling-full-nogc-640"]["case"]})
    terms = inkling_terms(job, precision(job), LoraLayout(enabled=False))
    assert terms.patches == terms.image_tokens == 272
    assert terms.blocks_saved[1] == 34_816 * 1_178 == 41_013_248
    assert terms.pixels == 272 * 2 * 40 * 40 * 3 * 4


def test_the_first_text_layer_s_input_gradient_terms_by_hand():
    """SFT LoRA all-linear without checkpointing, rows of 2,048 tokens, width 6144, lora_dropout 0.05: layer 0's
    input_layernorm keeps the fp32 copy of its bf16 input (4 · 6144 bytes a token) and the fp32 rsqrt (4), and four
    adapted Linears read its output (q/k/v/r_proj), each dropout a bool mask (6144): 2048 · (24,576 + 4 + 24,576) =
    100,671,488 bytes. With checkpointing: none."""
    from hpcmem.estimate.lora import lora_layout
    from hpcmem.estimate.vision_inkling_text import first_layer_input
    from hpcmem.job.shape import precision

    job = case_job({**RECORDS["inkling-lora-all-nogc-640"]["case"]})
    assert first_layer_input(job, precision(job), lora_layout(job), ("adapted",)) == 100_671_488
    gc = case_job({**RECORDS["inkling-lora-all-gc-640"]["case"]})
    assert first_layer_input(gc, precision(gc), lora_layout(gc), ("adapted",)) == 0


def test_the_matrix_is_all_there():
    assert len(RECORDS) == 8 + 4
    assert {(r["case"]["image_height"], r["case"]["image_width"]) for r in RECORDS.values()} == {(640, 640),
                                                                                               (960, 1280)}
    assert {r["cell"] for r in RECORDS.values()} == {f"{t}/{c}" for t in ("sft", "dpo")
                                                     for c in ("full+gc", "full+nogc", "lora+gc", "lora+nogc")}
    assert len(TWINS) == 8 and all(r["case"]["images_per_example"] == 0 for r in TWINS.values())


def test_images_add_to_the_estimate():
    job = case_job({**RECORDS["inkling-full-nogc-960x1280"]["case"]})
    assert largest_component(estimate(job), "vision activations") > 0


def test_grpo_with_images_is_refused():
    """SFT and DPO with images are traced (above); GRPO and RLOO with images are not: refused."""
    with pytest.raises(SpecError, match="with trainer grpo on inkling_mm_model: hpcmem models inkling_mm_model's "
                                        "images for sft, dpo only"):
        estimate(grpo_with_images_job(ROOT / CUT, 640, 640))

"""Unlimited-OCR SFT and DPO with images (UnlimitedOcrConfig's class defaults cut to 2 decoder, 2 CLIP and 2 SAM layers:
tests/fixtures/vlm/unlimited-ocr-defaults-L2-D2.json) against the trace of TRL's SFTTrainer and DPOTrainer with their
vision collators and transformers' UnlimitedOcrProcessor (around the trace's PIL stand-in image processor) on blank
640×640 (the global view alone) and 768×1536 (the global view and two 640 px tiles) images
(estimator/traces/vlm-unlimited-ocr.jsonl, written once by `hpcmem validate trace --cases estimator/cases/vlm-unlimited-ocr.yaml --reserved`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.estimate.workspaces import tensor_bytes
from hpcmem.validate.cases import case_job
from tests.helpers.stored_cases import grpo_with_images_job, largest_component, stored_case_job, trace_records

ROOT = Path(__file__).resolve().parents[2]
RECORDS = trace_records(ROOT, "vlm-unlimited-ocr")
CUT = "tests/fixtures/vlm/unlimited-ocr-defaults-L2-D2.json"


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    record = RECORDS[case_id]
    est = estimate(stored_case_job(record, ROOT))
    assert abs(max(tensor_bytes(p) for p in est.phases) - record["traced"]) <= 0.03 * record["traced"]


def test_the_matrix_is_all_there():
    assert len(RECORDS) == 8 + 4
    assert {r["case"]["model_name_or_path"] for r in RECORDS.values()} == {CUT}
    assert {(r["case"]["image_height"], r["case"]["image_width"]) for r in RECORDS.values()} == {(640, 640),
                                                                                                  (768, 1536)}
    assert {r["cell"] for r in RECORDS.values()} == {f"{t}/{c}" for t in ("sft", "dpo")
                                                     for c in ("full+gc", "full+nogc", "lora+gc", "lora+nogc")}


def test_the_global_view_s_probabilities_are_the_tower_s_widest():
    """DeepSeek-OCR 2's SAM (SDPA's math path under the decomposed relative positions keeps the fp32 probabilities
    [views, heads, G², G²] of the global layer): 12 × 4096² × 4 bytes for the 1024 px global view (layer 1 of the
    cut), 2 × 12 × 1600² × 4 for two 640 px tiles; the softmax backward holds two more. Blocks in the forward's
    order: the global run's 2 SAM and 2 CLIP layers, then the tiles' run's. A CLIP layer over 257 rows keeps per row
    at most 48 · width bytes — two LayerNorms' fp32 inputs, statistics and 16-bit outputs (2 × (4 + 2) · width), q,
    k, v and the attention output (8 · width), fc1's output with quick_gelu's sigmoid and fc2's input (3 × 2 · 4 ·
    width): 44 · width and the statistics — and no [heads, rows, rows] tensor (no mask: SDPA's flash path; the fp32
    and 16-bit scores of an eager or masked attention would add 16 · 257 · 6 bytes a row)."""
    from hpcmem.estimate.lora import LoraLayout
    from hpcmem.estimate.vision_unlimited_ocr import unlimited_ocr_terms
    from hpcmem.job.shape import precision

    job = case_job({**RECORDS["ulo-full-nogc-1536"]["case"]})
    terms = unlimited_ocr_terms(job, precision(job), LoraLayout(enabled=False))
    global_probs, tile_probs = 12 * 4096 ** 2 * 4, 2 * 12 * 1600 ** 2 * 4
    assert len(terms.blocks_saved) == 2 * (2 + 2)
    assert global_probs < terms.blocks_saved[1] < global_probs + 2 ** 28
    assert tile_probs < terms.blocks_saved[4 + 1] < tile_probs + 2 ** 28
    assert terms.blocks_saved[2] <= 257 * 1024 * 48
    assert terms.blocks_backward[1] >= 2 * global_probs - 2 ** 27
    assert terms.image_tokens == 16 * 17 + 1 + 10 * 21
    assert terms.blocks_grads[:4] == (0, 0, 0, 0) and all(terms.blocks_grads[4:])


def test_images_add_to_the_estimate():
    job = case_job({**RECORDS["ulo-full-nogc-640"]["case"]})
    assert largest_component(estimate(job), "vision activations") > 0


def test_grpo_with_images_is_refused():
    with pytest.raises(SpecError, match="with trainer grpo on unlimited_ocr: hpcmem models unlimited_ocr's "
                                        "images for sft, dpo only"):
        estimate(grpo_with_images_job(ROOT / CUT, 640, 640))

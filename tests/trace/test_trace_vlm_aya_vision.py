"""Aya Vision traced now against its estimate (its Cohere2 text part from a learned profile): TRL's SFTTrainer with
its vision collator and transformers' AyaVisionProcessor on a 364×728 image (2 tiles and a thumbnail), the cut of
estimator/cases/vlm-aya-vision.yaml, full fine-tuning without checkpointing: the step's peak and the tower's own
backward within 3 %. And what TRL's collator hands the model: 3 × 169 image tokens, the 5 markers around them
(<|START_OF_IMG|>, TILE_1, TILE_2, TILE_GLOBAL, <|END_OF_IMG|>) and the words."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from tests.helpers.trace_helpers import collated_image_row, estimate_holds_vision_trace, shipped_case_job  # noqa: E402

pytestmark = pytest.mark.torch


def test_the_trace_of_today_agrees_with_the_estimate():
    estimate_holds_vision_trace(shipped_case_job("vlm-aya-vision.yaml", "aya3t-full-nogc"), 3.0)


def test_the_collator_fills_the_row_with_the_tiles_tokens():
    from hpcmem.trace.vision_aya_vision import END, GLOBAL, START

    job = shipped_case_job("vlm-aya-vision.yaml", "aya3t-full-nogc")
    proc, batch = collated_image_row(job, 1024)
    ids = batch["input_ids"][0]
    assert ids.shape == (1024,)
    assert int((ids == proc.image_token_id).sum()) == 3 * (364 // 14 // 2) ** 2
    markers = proc.tokenizer.convert_tokens_to_ids([START, "TILE_1", "TILE_2", GLOBAL, END])
    assert [int((ids == m).sum()) for m in markers] == [1, 1, 1, 1, 1]
    assert tuple(batch["pixel_values"].shape) == (3, 3, 364, 364)

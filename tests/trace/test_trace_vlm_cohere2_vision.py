"""Cohere2 Vision traced now against its estimate (its Cohere2 text part from a learned profile): TRL's SFTTrainer with
its vision collator and transformers' Cohere2VisionProcessor on a 512×1024 image (2 tiles and a thumbnail), the cut
of estimator/cases/vlm-cohere2-vision.yaml, full fine-tuning without checkpointing: the step's peak and the tower's
own backward within 3 %. And what TRL's collator hands the model: 3 × 256 image tokens, the 5 markers around them
(<|START_OF_IMG|>, a <|IMG_LINE_BREAK|> after each tile, <|END_OF_IMG|>) and the words; 3 tiles of pixel_values."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from tests.helpers.trace_helpers import collated_image_row, estimate_holds_vision_trace, shipped_case_job  # noqa: E402

pytestmark = pytest.mark.torch


def test_the_trace_of_today_agrees_with_the_estimate():
    estimate_holds_vision_trace(shipped_case_job("vlm-cohere2-vision.yaml", "c2v3t-full-nogc"), 3.0)


def test_the_collator_fills_the_row_with_the_tiles_tokens():
    from hpcmem.trace.vision_aya_vision import BREAK, END, START

    job = shipped_case_job("vlm-cohere2-vision.yaml", "c2v3t-full-nogc")
    proc, batch = collated_image_row(job, 1024)
    ids = batch["input_ids"][0]
    assert ids.shape == (1024,)
    assert int((ids == proc.image_token_id).sum()) == 3 * (512 // 16 // 2) ** 2
    markers = proc.tokenizer.convert_tokens_to_ids([START, BREAK, END])
    assert [int((ids == m).sum()) for m in markers] == [1, 3, 1]
    assert tuple(batch["pixel_values"].shape) == (3, 3, 512, 512)
    assert "num_patches" not in batch          # Cohere2VisionProcessor.unused_input_names

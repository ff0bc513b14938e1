"""Gemma 4 traced now against its estimate (its text part from a learned profile): TRL's SFTTrainer with its vision
collator and transformers' Gemma4Processor on a 768×768 image, the cut of estimator/cases/vlm-gemma4.yaml, full
fine-tuning with checkpointing (the step's peak is the encoder's backward): the step's peak and the tower's own
backward within 3 %. And what TRL's collator hands the model: 256 image tokens between boi and eoi and the words;
pixel_values padded to 2,520 patch rows, image_position_ids (-1 on the 216 padding rows) and mm_token_type_ids."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from tests.helpers.trace_helpers import collated_image_row, estimate_holds_vision_trace, shipped_case_job  # noqa: E402

pytestmark = pytest.mark.torch


def test_the_trace_of_today_agrees_with_the_estimate():
    estimate_holds_vision_trace(shipped_case_job("vlm-gemma4.yaml", "g4sq-full-gc"), 3.0)


def test_the_collator_fills_the_row_with_the_image_s_tokens():
    from hpcmem.trace.vision_gemma4 import BOI, EOI

    job = shipped_case_job("vlm-gemma4.yaml", "g4sq-full-gc")
    proc, batch = collated_image_row(job, 1024)
    ids = batch["input_ids"][0]
    assert ids.shape == (1024,)
    assert int((ids == proc.image_token_id).sum()) == 256
    assert [int((ids == m).sum()) for m in proc.tokenizer.convert_tokens_to_ids([BOI, EOI])] == [1, 1]
    assert tuple(batch["pixel_values"].shape) == (1, 2520, 768)
    assert int((batch["image_position_ids"][0] == -1).all(-1).sum()) == 2520 - 48 * 48
    assert int((batch["mm_token_type_ids"][0] != 0).sum()) == 256

"""Gemma 4 unified traced now against its estimate (its text part from a learned profile): TRL's SFTTrainer with its
vision collator and transformers' Gemma4UnifiedProcessor on a 384×1536 image, the cut of
estimator/cases/vlm-gemma4-unified.yaml, full fine-tuning without checkpointing: the step's peak within 3 %. And what
TRL's collator hands the model: 264 image tokens between boi and eoi; pixel_values padded to 280 merged rows of 6,912
values, image_position_ids (-1 on the 16 padding rows) and mm_token_type_ids."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from tests.helpers.trace_helpers import collated_image_row, shipped_case_job  # noqa: E402

pytestmark = pytest.mark.torch


def test_the_trace_of_today_agrees_with_the_estimate():
    """The step's peak (the LM head's backward) within 3 %; the embedder has no blocks, so no tower-backward phase."""
    from hpcmem.estimate import estimate
    from hpcmem.estimate.workspaces import tensor_bytes
    from hpcmem.trace.run import run_trace

    job = shipped_case_job("vlm-gemma4-unified.yaml", "g4uwide-full-nogc")
    traced = run_trace(job)
    peak = max(tensor_bytes(p) for p in estimate(job).phases)
    assert abs(peak - traced.peak_allocated_bytes) <= 3 / 100 * traced.peak_allocated_bytes, \
        (peak, traced.peak_allocated_bytes)


def test_the_collator_fills_the_row_with_the_image_s_tokens():
    from hpcmem.trace.vision_gemma4 import BOI, EOI

    job = shipped_case_job("vlm-gemma4-unified.yaml", "g4uwide-full-nogc")
    proc, batch = collated_image_row(job, 1024)
    ids = batch["input_ids"][0]
    assert ids.shape == (1024,)
    assert int((ids == proc.image_token_id).sum()) == 264
    assert [int((ids == m).sum()) for m in proc.tokenizer.convert_tokens_to_ids([BOI, EOI])] == [1, 1]
    assert tuple(batch["pixel_values"].shape) == (1, 280, 6912)
    assert int((batch["image_position_ids"][0] == -1).all(-1).sum()) == 280 - 264
    assert int((batch["mm_token_type_ids"][0] != 0).sum()) == 264

"""LFM2-VL traced now against its estimate (its LFM2 text part from a learned profile): TRL's SFTTrainer with its
vision collator and Lfm2VlProcessor (around the PIL stand-in of hpcmem.trace.vision_lfm2_vl) on a 1024×1024 image (2
× 2 tiles and a thumbnail), the cut of estimator/cases/vlm-lfm2-vl.yaml, full fine-tuning without checkpointing: the
step's peak and the tower's own backward within 3 %. And what TRL's collator hands the model: 5 × 256 image tokens,
the 7 markers around them (<|image_start|>, one <|img_row_r_col_c|> a tile, <|img_thumbnail|>, <|image_end|>) and
the words; 5 tiles of 1,024 patch rows, spatial_shapes and pixel_attention_mask."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from tests.helpers.trace_helpers import collated_image_row, estimate_holds_vision_trace, shipped_case_job  # noqa: E402

pytestmark = pytest.mark.torch


def test_the_trace_of_today_agrees_with_the_estimate():
    estimate_holds_vision_trace(shipped_case_job("vlm-lfm2-vl.yaml", "lvl5t-full-nogc"), 3.0)


def test_the_collator_fills_the_row_with_the_tiles_tokens():
    from hpcmem.trace.vision_lfm2_vl import END, START, THUMBNAIL

    job = shipped_case_job("vlm-lfm2-vl.yaml", "lvl5t-full-nogc")
    proc, batch = collated_image_row(job, 2048)
    ids = batch["input_ids"][0]
    assert ids.shape == (2048,)
    assert int((ids == proc.image_token_id).sum()) == 5 * 256
    grid = proc.tokenizer.convert_tokens_to_ids([f"<|img_row_{r}_col_{c}|>" for r in (1, 2) for c in (1, 2)])
    markers = proc.tokenizer.convert_tokens_to_ids([START, THUMBNAIL, END]) + grid
    assert [int((ids == m).sum()) for m in markers] == [1] * 7
    assert tuple(batch["pixel_values"].shape) == (5, 1024, 768)
    assert batch["spatial_shapes"].tolist() == [[32, 32]] * 5
    assert int(batch["pixel_attention_mask"].sum()) == 5 * 1024

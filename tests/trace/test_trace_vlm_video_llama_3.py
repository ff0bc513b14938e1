"""VideoLLaMA3 traced now against its estimate: TRL's SFTTrainer with its vision collator and transformers'
VideoLlama3Processor on real 480×640 images (1,564 image tokens), VideoLLaMA3-2B's widths cut to 1 decoder layer and
2 tower layers (estimator/cases/vlm-video-llama-3.yaml), full fine-tuning without checkpointing: the step's peak and
the tower's own backward within 3 %. And what TRL's collator hands the model: every image's tokens and the words,
nothing around them; pixel_values as patch rows, image_grid_thw and image_merge_sizes."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from tests.helpers.trace_helpers import collated_image_row, estimate_holds_vision_trace, shipped_case_job  # noqa: E402

pytestmark = pytest.mark.torch


def _job(case_id: str):
    return shipped_case_job("vlm-video-llama-3.yaml", case_id)


def test_the_trace_of_today_agrees_with_the_estimate():
    estimate_holds_vision_trace(_job("vl3-480-full-nogc"), 3.0)


def test_the_collator_fills_the_row_with_the_images_tokens():
    job = _job("vl3-480-full-nogc")
    proc, batch = collated_image_row(job, 2048)
    ids = batch["input_ids"][0]
    assert ids.shape == (2048,)
    assert int((ids == proc.image_token_id).sum()) == 34 * 46
    assert tuple(batch["pixel_values"].shape) == (34 * 46, 3 * 14 * 14)
    assert batch["image_grid_thw"].tolist() == [[1, 34, 46]]
    assert batch["image_merge_sizes"].tolist() == [1]

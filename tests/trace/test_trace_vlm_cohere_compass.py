"""Cohere Compass (cohere_compass) traced now against its estimate: TRL's SFTTrainer with its vision collator and
CohereCompassProcessor on a 1024×768 image (3,072 patches, 768 image tokens), the cut of
estimator/cases/vlm-cohere-compass.yaml, LoRA all-linear with checkpointing: the step's peak and the tower's own
backward within 3 %. And what TRL's collator hands the model: the image tokens in Cohere Compass's spelling between
its vision markers."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from tests.helpers.trace_helpers import collated_image_row, estimate_holds_vision_trace, shipped_case_job  # noqa: E402

pytestmark = pytest.mark.torch


def test_the_trace_of_today_agrees_with_the_estimate():
    estimate_holds_vision_trace(shipped_case_job("vlm-cohere-compass.yaml", "ccomp1024-lora-all-gc"), 3.0)


def test_the_collator_fills_the_row_with_the_images_tokens():
    from hpcmem.trace.vision_cohere_compass import END, IMAGE, START

    job = shipped_case_job("vlm-cohere-compass.yaml", "ccomp1024-lora-all-gc")
    proc, batch = collated_image_row(job, 2048)
    ids = batch["input_ids"][0]
    assert ids.shape == (2048,)
    assert proc.image_token == IMAGE and int((ids == proc.image_token_id).sum()) == 48 * 64 // 4
    assert [int((ids == m).sum()) for m in proc.tokenizer.convert_tokens_to_ids([START, END])] == [1, 1]
    assert tuple(batch["pixel_values"].shape) == (48 * 64, 3 * 2 * 16 * 16)
    assert batch["image_grid_thw"].tolist() == [[1, 48, 64]]

"""GLM-OCR (glm_ocr) traced now against its estimate: TRL's SFTTrainer with its vision collator and Glm46VProcessor on a
1024×768 image (smart_resize to 1,036×756: 3,996 patches, 999 image tokens), the cut of
estimator/cases/vlm-glm-ocr.yaml, LoRA all-linear with checkpointing, whose peak is in the tower's backward (each
block's recompute runs q_norm / k_norm again): the step's peak and the tower's own backward within 3 %. And what TRL's
collator hands the model."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from tests.helpers.trace_helpers import collated_image_row, estimate_holds_vision_trace, shipped_case_job  # noqa: E402

pytestmark = pytest.mark.torch


def test_the_trace_of_today_agrees_with_the_estimate():
    estimate_holds_vision_trace(shipped_case_job("vlm-glm-ocr.yaml", "gocr1024-lora-all-gc"), 3.0)


def test_the_collator_fills_the_row_with_the_images_tokens():
    from hpcmem.trace.vision_glm4v import BEGIN_IMAGE, END_IMAGE

    job = shipped_case_job("vlm-glm-ocr.yaml", "gocr1024-lora-all-gc")
    proc, batch = collated_image_row(job, 2048)
    ids = batch["input_ids"][0]
    assert ids.shape == (2048,)
    assert int((ids == proc.image_token_id).sum()) == 54 * 74 // 4
    assert [int((ids == m).sum()) for m in proc.tokenizer.convert_tokens_to_ids([BEGIN_IMAGE, END_IMAGE])] == [1, 1]
    assert tuple(batch["pixel_values"].shape) == (54 * 74, 3 * 2 * 14 * 14)
    assert batch["image_grid_thw"].tolist() == [[1, 54, 74]]

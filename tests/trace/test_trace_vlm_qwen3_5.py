"""Qwen3.5 traced now against its estimate (its hybrid Gated DeltaNet / full-attention text part from a learned
profile, Qwen3-VL's tower without deepstack mergers): TRL's SFTTrainer with its vision collator and transformers'
Qwen3VLProcessor on an 896×896 image, the cut of estimator/cases/vlm-qwen3-5.yaml, full fine-tuning without
checkpointing: the step's peak and the tower's own backward within 3 %. And what TRL's collator hands the model:
784 image tokens between one vision_start and one vision_end, 3,136 patch rows of pixel_values, the image grid and
the mm_token_type_ids that Qwen3_5Model.compute_3d_position_ids needs for its multimodal rotary positions."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from tests.helpers.trace_helpers import collated_image_row, estimate_holds_vision_trace, shipped_case_job  # noqa: E402

pytestmark = pytest.mark.torch


def test_the_trace_of_today_agrees_with_the_estimate():
    estimate_holds_vision_trace(shipped_case_job("vlm-qwen3-5.yaml", "q35-full-nogc-896"), 3.0)


def test_the_collator_hands_the_model_the_image_s_tokens():
    from hpcmem.trace.vision import IMAGE_PAD, VISION_END, VISION_START

    job = shipped_case_job("vlm-qwen3-5.yaml", "q35-full-nogc-896")
    proc, batch = collated_image_row(job, 1536)
    ids = batch["input_ids"][0]
    assert ids.shape == (1536,)
    pad, start, end = proc.tokenizer.convert_tokens_to_ids([IMAGE_PAD, VISION_START, VISION_END])
    assert [int((ids == t).sum()) for t in (pad, start, end)] == [(896 // 32) ** 2, 1, 1]
    assert tuple(batch["pixel_values"].shape) == ((896 // 16) ** 2, 3 * 2 * 16 ** 2)
    assert batch["image_grid_thw"].tolist() == [[1, 56, 56]]
    assert int((batch["mm_token_type_ids"][0] == 1).sum()) == 784

"""GLM-4.6V (glm46v) traced now against its estimate: TRL's SFTTrainer with its vision collator and transformers'
Glm46VProcessor on an 800×600 image (smart_resize to 588×812: 2,436 patches, 609 image tokens), the cut of
estimator/cases/vlm-glm46v.yaml, LoRA all-linear without checkpointing: the step's peak and the tower's own backward
within 3 %. And what TRL's collator hands the model: 609 <|image|> tokens between <|begin_of_image|> and
<|end_of_image|>, 2,436 pixel rows of 3·2·14² values, mm_token_type_ids beside input_ids."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from tests.helpers.trace_helpers import collated_image_row, estimate_holds_vision_trace, shipped_case_job  # noqa: E402

pytestmark = pytest.mark.torch


def test_the_trace_of_today_agrees_with_the_estimate():
    estimate_holds_vision_trace(shipped_case_job("vlm-glm46v.yaml", "g46v800-lora-all-nogc"), 3.0)


def test_the_collator_fills_the_row_with_the_images_tokens():
    from hpcmem.trace.vision_glm4v import BEGIN_IMAGE, END_IMAGE

    job = shipped_case_job("vlm-glm46v.yaml", "g46v800-lora-all-nogc")
    proc, batch = collated_image_row(job, 1024)
    ids = batch["input_ids"][0]
    assert ids.shape == (1024,)
    assert int((ids == proc.image_token_id).sum()) == 42 * 58 // 4
    assert [int((ids == m).sum()) for m in proc.tokenizer.convert_tokens_to_ids([BEGIN_IMAGE, END_IMAGE])] == [1, 1]
    assert tuple(batch["pixel_values"].shape) == (42 * 58, 3 * 2 * 14 * 14)
    assert batch["image_grid_thw"].tolist() == [[1, 42, 58]]
    assert int((batch["mm_token_type_ids"][0] == 1).sum()) == 42 * 58 // 4

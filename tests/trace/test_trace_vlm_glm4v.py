"""GLM-4.1V traced now against its estimate: TRL's SFTTrainer with its vision collator and transformers'
Glm4vProcessor on a 640×480 image (smart_resize to 476×644: 1,564 patches, 391 image tokens), the cut of
estimator/cases/vlm-glm4v.yaml, LoRA all-linear without checkpointing: the step's peak and the tower's own backward
within 3 %. And what TRL's collator hands the model: 391 <|image|> tokens between <|begin_of_image|> and
<|end_of_image|>, 1,564 pixel rows of 3·2·14² values, mm_token_type_ids beside input_ids."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from tests.helpers.trace_helpers import collated_image_row, estimate_holds_vision_trace, shipped_case_job  # noqa: E402

pytestmark = pytest.mark.torch


def test_the_trace_of_today_agrees_with_the_estimate():
    estimate_holds_vision_trace(shipped_case_job("vlm-glm4v.yaml", "g4v640-lora-all-nogc"), 3.0)


def test_the_collator_fills_the_row_with_the_images_tokens():
    from hpcmem.trace.vision_glm4v import BEGIN_IMAGE, END_IMAGE

    job = shipped_case_job("vlm-glm4v.yaml", "g4v640-lora-all-nogc")
    proc, batch = collated_image_row(job, 1024)
    ids = batch["input_ids"][0]
    assert ids.shape == (1024,)
    assert int((ids == proc.image_token_id).sum()) == 34 * 46 // 4
    assert [int((ids == m).sum()) for m in proc.tokenizer.convert_tokens_to_ids([BEGIN_IMAGE, END_IMAGE])] == [1, 1]
    assert tuple(batch["pixel_values"].shape) == (34 * 46, 3 * 2 * 14 * 14)
    assert batch["image_grid_thw"].tolist() == [[1, 34, 46]]
    assert int((batch["mm_token_type_ids"][0] == 1).sum()) == 34 * 46 // 4

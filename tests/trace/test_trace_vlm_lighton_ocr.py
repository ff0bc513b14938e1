"""LightOnOCR traced now against its estimate: TRL's SFTTrainer with its vision collator and transformers'
LightOnOcrProcessor on a real 1540×1540 image, LightOnOCR-1B's widths cut to 1 decoder layer and 2 Pixtral layers
(estimator/cases/vlm-lighton-ocr.yaml), LoRA all-linear with checkpointing: the step's peak and the tower's own
backward within 3 % (without checkpointing the tower's backward reads +5.8 % high, estimator/LOG.md). And what TRL's
collators hand LightOnOcrForConditionalGeneration: each image at its own resized size (sides in 14 px steps) in
pixel_values, its image_sizes, and (height // 28) · (width // 28) image tokens, no breaks."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from tests.helpers.trace_helpers import collated_image_row, estimate_holds_vision_trace, shipped_case_job  # noqa: E402

pytestmark = pytest.mark.torch


def _job(case_id: str, **over):
    return shipped_case_job("vlm-lighton-ocr.yaml", case_id, **over)


@pytest.mark.slow
def test_the_trace_of_today_agrees_with_the_estimate():
    estimate_holds_vision_trace(_job("lo-lora-all-gc-1540"), 3.0)


@pytest.mark.parametrize(("hw", "images", "pixel_shape", "tokens"), [
    # 448×658 fits, 658 = 14 · 47: 16 · 23 tokens (the odd patch column has no token)
    ((448, 658), 1, (1, 3, 448, 658), 16 * 23),
    # 3000×2000 is scaled to 1540×1026, its width rounded up to 14 · 74 = 1036: 55 · 37, two images
    ((3000, 2000), 2, (2, 3, 1540, 1036), 2 * 55 * 37),
])
def test_the_collator_hands_each_image_and_its_tokens(hw, images, pixel_shape, tokens):
    from hpcmem.job.images import image_geometry

    job = _job("lo-full-nogc-448", image_height=hw[0], image_width=hw[1], images_per_example=images, max_length=8192)
    proc, batch = collated_image_row(job, 8192)
    ids = batch["input_ids"][0]
    assert ids.shape == (8192,)
    assert int((ids == proc.image_token_id).sum()) == tokens
    assert sum(int((ids == i).sum()) for i in proc.image_token_ids) == tokens     # no break or end tokens
    assert tokens == images * image_geometry(job.train, job.model.vision).tokens
    assert tuple(batch["pixel_values"].shape) == pixel_shape
    assert batch["image_sizes"].tolist() == [list(pixel_shape[2:])] * images


def test_the_preference_collator_repeats_each_image_for_chosen_and_rejected():
    """TRL 1.16's DPO collator runs LightOnOcrProcessor on the prompt twice (chosen, rejected): a 448×658 image in each
    row, pixel_values [2, 3, 448, 658], 368 image tokens per row."""
    from PIL import Image
    from trl.trainer.dpo_trainer import DataCollatorForVisionPreference

    from hpcmem.trace.vision import processor

    proc = processor(_job("lo-full-gc-448"))
    example = {"images": [Image.new("RGB", (658, 448))], "prompt": [{"role": "user", "content": "t3"}],
               "chosen": [{"role": "assistant", "content": "t3"}], "rejected": [{"role": "assistant", "content": "t3"}]}
    batch = DataCollatorForVisionPreference(processor=proc)([example])
    assert tuple(batch["pixel_values"].shape) == (2, 3, 448, 658)
    assert batch["image_sizes"].tolist() == [[448, 658]] * 2
    assert (batch["input_ids"] == proc.image_token_id).sum(dim=1).tolist() == [16 * 23] * 2

"""Mistral 3 traced now against its estimate: TRL's SFTTrainer with its vision collator and transformers'
PixtralProcessor on a real 1540×1540 image, Mistral-Small-3.1-24B's widths cut to 1 decoder layer and 2 Pixtral layers
(estimator/cases/vlm-mistral3.yaml), LoRA all-linear without checkpointing: the step's peak and the tower's own
backward within 3 %. And what TRL's collator hands Mistral3ForConditionalGeneration: each image at its own resized
size in pixel_values, its image_sizes, and rows · (cols + 1) image tokens ([IMG], [IMG_BREAK], [IMG_END])."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from tests.helpers.trace_helpers import collated_image_row, estimate_holds_vision_trace, shipped_case_job  # noqa: E402

pytestmark = pytest.mark.torch


def _job(case_id: str, **over):
    return shipped_case_job("vlm-mistral3.yaml", case_id, **over)


def test_the_trace_of_today_agrees_with_the_estimate():
    estimate_holds_vision_trace(_job("m3-lora-all-nogc-1540"), 3.0)


@pytest.mark.parametrize(("hw", "images", "pixel_shape", "tokens"), [
    # 448×672 fits: 16 merged rows of 24 [IMG], a break after each but the last's [IMG_END]
    ((448, 672), 1, (1, 3, 448, 672), 16 * 25),
    # 3000×2000 is scaled to 1540×1026, its width rounded up to 1036: 55 rows of 37, two images
    ((3000, 2000), 2, (2, 3, 1540, 1036), 2 * 55 * 38),
])
def test_the_collator_hands_each_image_and_its_tokens(hw, images, pixel_shape, tokens):
    from hpcmem.job.images import image_geometry

    job = _job("m3-full-nogc-448", image_height=hw[0], image_width=hw[1], images_per_example=images, max_length=8192)
    proc, batch = collated_image_row(job, 8192)
    ids = batch["input_ids"][0]
    assert ids.shape == (8192,)
    counted = sum(int((ids == i).sum()) for i in proc.image_token_ids)
    assert counted == tokens == images * image_geometry(job.train, job.model.vision).tokens
    assert tuple(batch["pixel_values"].shape) == pixel_shape
    assert batch["image_sizes"].tolist() == [list(pixel_shape[2:])] * images


def test_the_preference_collator_repeats_each_image_for_chosen_and_rejected():
    """TRL 1.16's DPO collator runs PixtralProcessor on the prompt twice (chosen, rejected): a 448×672 image in each
    row, pixel_values [2, 3, 448, 672], 400 image tokens per row."""
    from PIL import Image
    from trl.trainer.dpo_trainer import DataCollatorForVisionPreference

    from hpcmem.trace.vision import processor

    proc = processor(_job("m3-full-gc-448"))
    example = {"images": [Image.new("RGB", (672, 448))], "prompt": [{"role": "user", "content": "t3"}],
               "chosen": [{"role": "assistant", "content": "t3"}], "rejected": [{"role": "assistant", "content": "t3"}]}
    batch = DataCollatorForVisionPreference(processor=proc)([example])
    assert tuple(batch["pixel_values"].shape) == (2, 3, 448, 672)
    assert batch["image_sizes"].tolist() == [[448, 672]] * 2
    counted = sum((batch["input_ids"] == i).sum(dim=1) for i in proc.image_token_ids)
    assert counted.tolist() == [16 * 25] * 2

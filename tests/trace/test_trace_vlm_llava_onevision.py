"""LLaVA-OneVision traced now against its estimate: TRL's SFTTrainer with its vision collator and transformers'
LlavaOnevisionProcessor on a real 384×768 image, llava-onevision-qwen2-7b's widths cut to 1 decoder layer and 4 SigLIP
layers (estimator/cases/vlm-llava-onevision.yaml), full fine-tuning without checkpointing: the step's peak and the
tower's own backward within 3 %. And what TRL's collator hands LlavaOnevisionForConditionalGeneration: for a
1152×1536 image alone in its row the 1152×1536 pinpoint's 3 × 4 tiles and the base image as pixel_values
[1, 13, 3, 384, 384] and 7,309 image tokens (the 81 × 108 grid downscaled to 70 × 93, 70 newlines, the base tile's
27² = 729); for two images in one row one tile each, 729 + 1 tokens each."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from tests.helpers.trace_helpers import collated_image_row, estimate_holds_vision_trace, shipped_case_job  # noqa: E402

pytestmark = pytest.mark.torch


def _job(case_id: str, **over):
    return shipped_case_job("vlm-llava-onevision.yaml", case_id, **over)


def test_the_trace_of_today_agrees_with_the_estimate():
    estimate_holds_vision_trace(_job("lov-full-nogc-3t"), 3.0)


@pytest.mark.parametrize(("images", "pixel_shape", "tokens"), [
    (1, (1, 13, 3, 384, 384), 70 * 93 + 70 + 729),
    (2, (2, 1, 3, 384, 384), 2 * (729 + 1)),
])
def test_the_collator_hands_the_tiles_and_their_tokens(images, pixel_shape, tokens):
    from hpcmem.job.images import image_geometry

    job = _job("lov-full-nogc-13t", images_per_example=images, max_length=8192)
    proc, batch = collated_image_row(job, 8192)
    ids = batch["input_ids"][0]
    assert ids.shape == (8192,)
    assert int((ids == proc.image_token_id).sum()) == tokens
    assert tokens == images * image_geometry(job.train, job.model.vision).tokens
    assert tuple(batch["pixel_values"].shape) == pixel_shape
    assert batch["image_sizes"].tolist() == [[1152, 1536]] * images
    assert batch["batch_num_images"].tolist() == [images]


def test_the_preference_collator_repeats_the_tiles_for_chosen_and_rejected():
    """TRL 1.16's DPO collator runs LlavaOnevisionProcessor on the prompt twice (chosen, rejected), one image each
    (batch_num_images [1, 1]: each is tiled): a 384×768 image's 1 × 2 tiles and base image in each row,
    27·54 unpadded + 27 newlines + 729 = 2,214 image tokens per row."""
    from PIL import Image
    from trl.trainer.dpo_trainer import DataCollatorForVisionPreference

    from hpcmem.trace.vision import processor

    proc = processor(_job("lov-full-gc-3t"))
    example = {"images": [Image.new("RGB", (768, 384))], "prompt": [{"role": "user", "content": "t3"}],
               "chosen": [{"role": "assistant", "content": "t3"}], "rejected": [{"role": "assistant", "content": "t3"}]}
    batch = DataCollatorForVisionPreference(processor=proc)([example])
    assert tuple(batch["pixel_values"].shape) == (2, 3, 3, 384, 384)
    assert (batch["input_ids"] == proc.image_token_id).sum(dim=1).tolist() == [27 * 54 + 27 + 729] * 2

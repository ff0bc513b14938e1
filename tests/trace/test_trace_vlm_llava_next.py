"""LLaVA-NeXT traced now against its estimate: TRL's SFTTrainer with its vision collator and transformers'
LlavaNextProcessor on a real 336×672 image, llava-v1.6-mistral-7b's widths cut to 1 decoder layer and 4 CLIP layers
(estimator/cases/vlm-llava-next.yaml), full fine-tuning without checkpointing: the step's peak and the tower's own
backward within 3 %. And what TRL's collator hands LlavaNextForConditionalGeneration for a 480×640 image: the 672×672
pinpoint's 2 × 2 tiles and the base image as pixel_values [1, 5, 3, 336, 336], its size, and 2,340 image tokens
(36 unpadded rows of 48 patches, 36 newlines, the base tile's 24² = 576)."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from tests.helpers.trace_helpers import collated_image_row, estimate_holds_vision_trace, shipped_case_job  # noqa: E402

pytestmark = pytest.mark.torch


def _job(case_id: str):
    return shipped_case_job("vlm-llava-next.yaml", case_id)


def test_the_trace_of_today_agrees_with_the_estimate():
    estimate_holds_vision_trace(_job("lnext-full-nogc-3t"), 3.0)


def test_the_collator_hands_the_tiles_and_their_tokens():
    job = _job("lnext-full-nogc-5t")
    proc, batch = collated_image_row(job, 3072)
    ids = batch["input_ids"][0]
    assert ids.shape == (3072,)
    assert int((ids == proc.image_token_id).sum()) == 36 * 48 + 36 + 576
    assert tuple(batch["pixel_values"].shape) == (1, 5, 3, 336, 336)
    assert batch["image_sizes"].tolist() == [[480, 640]]


def test_the_preference_collator_repeats_the_tiles_for_chosen_and_rejected():
    """TRL 1.16's DPO collator runs LlavaNextProcessor on the prompt twice (chosen, rejected): a 336×672 image's
    1 × 2 tiles and base image in each row, 24·48 unpadded + 24 newlines + 576 = 1,752 image tokens per row."""
    from PIL import Image
    from trl.trainer.dpo_trainer import DataCollatorForVisionPreference

    from hpcmem.trace.vision import processor

    proc = processor(_job("lnext-full-gc-3t"))
    example = {"images": [Image.new("RGB", (672, 336))], "prompt": [{"role": "user", "content": "t3"}],
               "chosen": [{"role": "assistant", "content": "t3"}], "rejected": [{"role": "assistant", "content": "t3"}]}
    batch = DataCollatorForVisionPreference(processor=proc)([example])
    assert tuple(batch["pixel_values"].shape) == (2, 3, 3, 336, 336)
    assert (batch["input_ids"] == proc.image_token_id).sum(dim=1).tolist() == [24 * 48 + 24 + 576] * 2

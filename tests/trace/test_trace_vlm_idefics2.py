"""Idefics2 traced now against its estimate: TRL's SFTTrainer with its vision collator and transformers'
Idefics2Processor on blank 1200×1600 images resized to 735×980, the cut config of estimator/cases/vlm-idefics2.yaml,
LoRA all-linear with checkpointing (the peak in the connector's forward): the step's peak and the tower's own backward
within 3 %. And what TRL's collators hand the model: each image's 64 image tokens between fake tokens (one shared
between adjacent images), pixel_values at the resized size and its int64 pixel mask; DPO's preference collator runs
the processor on both copies of each image."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from tests.helpers.trace_helpers import collated_image_row, estimate_holds_vision_trace, shipped_case_job  # noqa: E402

pytestmark = pytest.mark.torch


def _job(case_id: str, **changes):
    return shipped_case_job("vlm-idefics2.yaml", case_id, **changes)


@pytest.mark.slow
def test_the_trace_of_today_agrees_with_the_estimate():
    estimate_holds_vision_trace(_job("i2-1200x1600-lora-all-gc-2img"), 3.0)


def test_the_collator_fills_the_row():
    job = _job("i2-1200x1600-lora-all-gc-2img")
    proc, batch = collated_image_row(job, 512)
    ids = batch["input_ids"][0]
    fake = proc.tokenizer.convert_tokens_to_ids(proc.fake_image_token)
    assert ids.shape == (512,)
    assert int((ids == proc.image_token_id).sum()) == 2 * 64
    assert int((ids == fake).sum()) == 2 + 1
    assert tuple(batch["pixel_values"].shape) == (1, 2, 3, 735, 980)
    assert tuple(batch["pixel_attention_mask"].shape) == (1, 2, 735, 980)
    assert int(batch["pixel_attention_mask"].sum()) == 2 * 735 * 980


def test_the_preference_collator_runs_both_copies():
    from PIL import Image
    from trl.trainer.dpo_trainer import DataCollatorForVisionPreference

    from hpcmem.trace.vision import processor

    proc = processor(shipped_case_job("vlm-idefics2-dpo.yaml", "i2-dpo-full-gc-448"))
    example = {"images": [Image.new("RGB", (448, 448))], "prompt": [{"role": "user", "content": "t3"}],
               "chosen": [{"role": "assistant", "content": "t3"}], "rejected": [{"role": "assistant", "content": "t3"}]}
    batch = DataCollatorForVisionPreference(processor=proc)([example])
    assert tuple(batch["pixel_values"].shape) == (2, 1, 3, 448, 448)
    assert int((batch["input_ids"] == proc.image_token_id).sum()) == 2 * 64

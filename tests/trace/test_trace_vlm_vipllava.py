"""ViP-LLaVA traced now against its estimate: TRL's SFTTrainer with its vision collator and transformers' LlavaProcessor
(the processor models/auto/processing_auto.py names for vipllava) on a real 336×336 image, llava-hf/vip-llava-7b-hf's
widths cut to 1 decoder layer and 12 CLIP layers (estimator/cases/vlm-vipllava.yaml), full fine-tuning without
checkpointing: the step's peak and the tower's own backward within 3 %. And what TRL's collators hand
VipLlavaForConditionalGeneration: 576 image tokens and one [3, 336, 336] image per image, chosen and rejected each
their own under DPO."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from tests.helpers.trace_helpers import estimate_holds_vision_trace, shipped_case_job  # noqa: E402

pytestmark = pytest.mark.torch


def _job(case_id: str):
    return shipped_case_job("vlm-vipllava.yaml", case_id)


def test_the_trace_of_today_agrees_with_the_estimate():
    estimate_holds_vision_trace(_job("vip-full-nogc-1img"), 3.0)


def test_the_collators_hand_the_images_and_their_tokens():
    from PIL import Image
    from transformers.models.llava.processing_llava import LlavaProcessor
    from trl.trainer.dpo_trainer import DataCollatorForVisionPreference
    from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling

    from hpcmem.trace.vision import make_image_dataset, processor

    job = _job("vip-full-nogc-2img")
    proc = processor(job)
    assert isinstance(proc, LlavaProcessor)
    row = dict(make_image_dataset(job, (1536,), 1)[0])
    batch = DataCollatorForVisionLanguageModeling(processor=proc)([row])
    assert batch["input_ids"].shape == (1, 1536)
    assert int((batch["input_ids"] == proc.image_token_id).sum()) == 2 * (336 // 14) ** 2
    assert tuple(batch["pixel_values"].shape) == (2, 3, 336, 336)
    example = {"images": [Image.new("RGB", (640, 480))], "prompt": [{"role": "user", "content": "t3"}],
               "chosen": [{"role": "assistant", "content": "t3"}], "rejected": [{"role": "assistant", "content": "t3"}]}
    pref = DataCollatorForVisionPreference(processor=proc)([example])
    assert tuple(pref["pixel_values"].shape) == (2, 3, 336, 336)
    assert (pref["input_ids"] == proc.image_token_id).sum(dim=1).tolist() == [576, 576]

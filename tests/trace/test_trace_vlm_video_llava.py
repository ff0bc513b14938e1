"""Video-LLaVA traced now against its estimate: TRL's SFTTrainer with its vision collator and transformers'
VideoLlavaProcessor (VideoLlavaImageProcessor, no video processor) on a real 224×224 image,
LanguageBind/Video-LLaVA-7B-hf's widths cut to 1 decoder layer and 4 CLIP layers per tower
(estimator/cases/vlm-video-llava.yaml), full fine-tuning without checkpointing: the step's peak and the image tower's
own backward within 3 %. And what TRL's collators hand VideoLlavaForConditionalGeneration: `pixel_values_images` (the
image processor's legacy key, which the model's forward takes as pixel_values), 256 image tokens per image, chosen and
rejected each their own under DPO; the trace names the image tower's blocks, not the idle video tower's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("trl")

from tests.helpers.trace_helpers import estimate_holds_vision_trace, shipped_case_job  # noqa: E402

pytestmark = pytest.mark.torch


def _job(case_id: str):
    return shipped_case_job("vlm-video-llava.yaml", case_id)


def test_the_trace_of_today_agrees_with_the_estimate():
    estimate_holds_vision_trace(_job("vl-full-nogc-2img"), 3.0)


def test_the_collators_hand_the_images_and_their_tokens():
    from PIL import Image
    from transformers.models.video_llava.processing_video_llava import VideoLlavaProcessor
    from trl.trainer.dpo_trainer import DataCollatorForVisionPreference
    from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling

    from hpcmem.trace.vision import make_image_dataset, processor

    job = _job("vl-full-nogc-2row-2img")
    proc = processor(job)
    assert isinstance(proc, VideoLlavaProcessor) and proc.video_processor is None
    row = dict(make_image_dataset(job, (1024,), 1)[0])
    batch = DataCollatorForVisionLanguageModeling(processor=proc)([row])
    assert int((batch["input_ids"] == proc.image_token_id).sum()) == 2 * (224 // 14) ** 2
    assert int((batch["input_ids"] == proc.video_token_id).sum()) == 0
    assert tuple(batch["pixel_values_images"].shape) == (2, 3, 224, 224)
    example = {"images": [Image.new("RGB", (640, 480))], "prompt": [{"role": "user", "content": "t3"}],
               "chosen": [{"role": "assistant", "content": "t3"}], "rejected": [{"role": "assistant", "content": "t3"}]}
    pref = DataCollatorForVisionPreference(processor=proc)([example])
    assert tuple(pref["pixel_values_images"].shape) == (2, 3, 224, 224)
    assert (pref["input_ids"] == proc.image_token_id).sum(dim=1).tolist() == [256, 256]


def test_the_image_tower_is_the_vision_tower():
    """The trace names image_tower's blocks "vision block N" and the language model's "layer N"; video_tower's are
    neither (images never run them)."""
    from hpcmem.trace.layer_map import decoder_layers, idle_tower_blocks, vision_blocks
    from tests.helpers.meta_models import meta_image_text_model

    cfg = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "vlm" / "video-llava-7b-width-L1-D4.json")
                     .read_text())
    model = meta_image_text_model(cfg)
    image = [id(x) for x in model.model.image_tower.encoder.layers]
    video = [id(x) for x in model.model.video_tower.encoder.layers]
    assert [id(x) for x in vision_blocks(model)] == image
    assert [id(x) for x in idle_tower_blocks(model)] == video
    assert [id(x) for x in decoder_layers(model)] == [id(x) for x in model.model.language_model.layers]

"""InternVL traced now against its estimate: TRL's SFTTrainer with its vision collator, transformers'
GotOcr2ImageProcessorPil (crop_to_patches, 1..12 tiles: an 800×1200 image is 3 × 2 tiles and a thumbnail) and
InternVLProcessor on a real image, InternVL3-8B's widths cut to 1 decoder layer and 2 InternViT layers
(estimator/cases/vlm-internvl.yaml): full fine-tuning without checkpointing (every layer's saved tensors, the layer
scale's operands among them) and LoRA on every linear under checkpointing (a recomputed layer and its adapters'
gradients); the collator's tiles and image tokens."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from tests.helpers.trace_helpers import estimate_holds_vision_trace, shipped_case_job  # noqa: E402

pytestmark = pytest.mark.torch
MAX_PCT = 3.0


def _job(case_id: str):
    return shipped_case_job("vlm-internvl.yaml", case_id)


def test_full_fine_tuning_agrees_with_the_estimate():
    estimate_holds_vision_trace(_job("internvl-full-nogc-7t"), MAX_PCT)


def test_lora_under_checkpointing_agrees_with_the_estimate():
    estimate_holds_vision_trace(_job("internvl-lora-all-gc-3t"), MAX_PCT)


def test_the_collator_writes_each_tiles_image_tokens():
    """TRL's DataCollatorForVisionLanguageModeling through the trace's InternVLProcessor: 7 tiles of 448 px in
    pixel_values and 7 × 256 <IMG_CONTEXT> tokens between <img> and </img>, as hpcmem.job.images counts them."""
    from PIL import Image
    from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling

    from hpcmem.trace import vision, vision_internvl

    job = _job("internvl-full-gc-7t")
    proc = vision.processor(job)
    collator = DataCollatorForVisionLanguageModeling(processor=proc, max_length=job.train.max_length)
    batch = collator([{"images": [Image.new("RGB", (1200, 800))],
                       "messages": [{"role": "user", "content": "word word"}]}])
    assert tuple(batch["pixel_values"].shape) == (7, 3, 448, 448)
    ids = batch["input_ids"][0].tolist()
    tok = proc.tokenizer
    assert ids.count(tok.convert_tokens_to_ids(vision_internvl.CONTEXT)) == 7 * 256
    assert ids.count(tok.convert_tokens_to_ids(vision_internvl.START)) == 1
    assert vision.token_ids(proc) == {"image_token_id": tok.convert_tokens_to_ids(vision_internvl.CONTEXT)}


def test_the_preference_collator_tiles_each_image_for_chosen_and_rejected():
    """TRL 1.16's DPO collator runs InternVLProcessor on the prompt twice (chosen, rejected), one image each: a
    448×896 image's 2 × 1 tiles and thumbnail per row, 3 × 256 <IMG_CONTEXT> tokens in each row."""
    from PIL import Image
    from trl.trainer.dpo_trainer import DataCollatorForVisionPreference

    from hpcmem.trace.vision import processor

    proc = processor(_job("internvl-full-gc-3t"))
    example = {"images": [Image.new("RGB", (896, 448))], "prompt": [{"role": "user", "content": "t3"}],
               "chosen": [{"role": "assistant", "content": "t3"}], "rejected": [{"role": "assistant", "content": "t3"}]}
    batch = DataCollatorForVisionPreference(processor=proc)([example])
    assert tuple(batch["pixel_values"].shape) == (6, 3, 448, 448)
    assert (batch["input_ids"] == proc.image_token_id).sum(dim=1).tolist() == [3 * 256] * 2

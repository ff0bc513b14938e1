"""Qianfan-OCR traced now against its estimate: TRL's SFTTrainer with its vision collator, transformers'
GotOcr2ImageProcessorPil (crop_to_patches, 1..12 tiles) and QianfanOCRProcessor on a real image, QianfanOCRConfig's
default widths cut to 1 Qwen3 decoder layer and 2 vision layers (estimator/cases/vlm-qianfan-ocr.yaml): full
fine-tuning without checkpointing and LoRA on every linear under checkpointing; the collator's tiles and image tokens
through the `<image>` placeholder; the second vision layer's DropPath live in training."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from tests.helpers.trace_helpers import estimate_holds_vision_trace, shipped_case_job  # noqa: E402

pytestmark = pytest.mark.torch
MAX_PCT = 3.0


def _job(case_id: str):
    return shipped_case_job("vlm-qianfan-ocr.yaml", case_id)


@pytest.mark.slow
def test_full_fine_tuning_agrees_with_the_estimate():
    estimate_holds_vision_trace(_job("qianfan-full-nogc-7t"), MAX_PCT)


@pytest.mark.slow
def test_lora_under_checkpointing_agrees_with_the_estimate():
    estimate_holds_vision_trace(_job("qianfan-lora-all-gc-3t"), MAX_PCT)


def test_the_collator_writes_each_tiles_image_tokens():
    """TRL's DataCollatorForVisionLanguageModeling through the trace's QianfanOCRProcessor: 7 tiles of 448 px in
    pixel_values and 7 × 256 <IMG_CONTEXT> tokens between <img> and </img>, as hpcmem.job.images counts them."""
    from PIL import Image
    from transformers.models.qianfan_ocr.processing_qianfan_ocr import QianfanOCRProcessor
    from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling

    from hpcmem.trace import vision, vision_internvl

    job = _job("qianfan-full-gc-7t")
    proc = vision.processor(job)
    assert isinstance(proc, QianfanOCRProcessor)
    collator = DataCollatorForVisionLanguageModeling(processor=proc, max_length=job.train.max_length)
    batch = collator([{"images": [Image.new("RGB", (1200, 800))],
                       "messages": [{"role": "user", "content": "word word"}]}])
    assert tuple(batch["pixel_values"].shape) == (7, 3, 448, 448)
    ids = batch["input_ids"][0].tolist()
    tok = proc.tokenizer
    assert ids.count(tok.convert_tokens_to_ids(vision_internvl.CONTEXT)) == 7 * 256
    assert ids.count(tok.convert_tokens_to_ids(vision_internvl.START)) == 1
    assert vision.token_ids(proc) == {"image_token_id": tok.convert_tokens_to_ids(vision_internvl.CONTEXT)}


def test_the_second_layer_drops_paths_in_training():
    """torch.linspace(0, drop_path_rate, 2): the first layer's rate 0 (nn.Identity), the second's 0.1, a
    QianfanOCRDropPath that draws its per-tile mask only in training."""
    import json
    from pathlib import Path

    from tests.helpers.meta_models import meta_image_text_model

    cfg = json.loads((Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "vlm"
                      / "qianfan-ocr-defaults-L1-D2.json").read_text())
    layers = meta_image_text_model(cfg).model.vision_tower.layers
    assert [type(x.drop_path1).__name__ for x in layers] == ["Identity", "QianfanOCRDropPath"]
    assert layers[1].drop_path2.drop_prob == pytest.approx(0.1)

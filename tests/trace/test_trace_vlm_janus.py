"""Janus traced now against its estimate: TRL's SFTTrainer with its vision collator and transformers' JanusProcessor on
real 480×640 images resized and padded to 384 px, Janus-Pro-1B's widths cut to 1 decoder layer and 4 tower layers
(estimator/cases/vlm-janus.yaml), full fine-tuning without checkpointing: the step's peak and the tower's own backward
within 3 %. And what TRL's collators hand the model: every image's 576 tokens between a begin- and an end-of-image
token; DPO's preference collator each image for chosen and rejected."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from tests.helpers.trace_helpers import collated_image_row, estimate_holds_vision_trace, shipped_case_job  # noqa: E402

pytestmark = pytest.mark.torch


def _job(case_id: str, cases: str = "vlm-janus.yaml"):
    return shipped_case_job(cases, case_id)


def test_the_trace_of_today_agrees_with_the_estimate():
    estimate_holds_vision_trace(_job("janus384-full-nogc"), 3.0)


def test_the_collator_writes_boi_the_images_tokens_and_eoi():
    from hpcmem.trace.vision_janus import BOI, EOI, IMAGE_TOKEN

    job = _job("janus384-full-nogc")
    proc, batch = collated_image_row(job, 1024)
    ids = batch["input_ids"][0]
    assert ids.shape == (1024,)
    tok = proc.tokenizer.convert_tokens_to_ids
    assert int((ids == tok(IMAGE_TOKEN)).sum()) == (384 // 16) ** 2
    assert int((ids == tok(BOI)).sum()) == 1 and int((ids == tok(EOI)).sum()) == 1
    assert tuple(batch["pixel_values"].shape) == (1, 3, 384, 384)


def test_the_preference_collator_runs_each_image_for_chosen_and_rejected():
    from trl.trainer.dpo_trainer import DataCollatorForVisionPreference

    from hpcmem.trace.data import BatchDesign
    from hpcmem.trace.vision import processor
    from hpcmem.trace.vision_janus import IMAGE_TOKEN
    from hpcmem.trace.vision_pref import make_vision_preference_dataset

    job = _job("janus-dpo-full-gc-512", "vlm-janus-dpo.yaml")
    proc = processor(job)
    rows = make_vision_preference_dataset(job, BatchDesign(layout="padded", documents=(1536,), batch_shape=(2, 1536),
                                                        tokens=2 * 1536, note=""), 1)
    batch = DataCollatorForVisionPreference(processor=proc, max_length=1536)([dict(rows[0])])
    assert tuple(batch["pixel_values"].shape) == (2, 3, 512, 512)
    assert batch["input_ids"].shape[0] == 2
    image = proc.tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    assert int((batch["input_ids"] == image).sum()) == 2 * (512 // 16) ** 2

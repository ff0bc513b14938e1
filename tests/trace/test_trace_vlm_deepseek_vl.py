"""DeepSeek-VL traced now against its estimate: TRL's SFTTrainer with its vision collator and transformers'
DeepseekVLProcessor on real 480×640 images resized and padded to 384 px, DeepSeek-VL 1.3B's widths cut to 1 decoder
layer and 4 SigLIP layers (estimator/cases/vlm-deepseek-vl.yaml), full fine-tuning without checkpointing: the step's
peak and the tower's own backward within 3 %. And what TRL's collators hand the model: every image's 576 tokens and
the words, nothing around them; DPO's preference collator each image for chosen and rejected."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from tests.helpers.trace_helpers import collated_image_row, estimate_holds_vision_trace, shipped_case_job  # noqa: E402

pytestmark = pytest.mark.torch


def _job(case_id: str, cases: str = "vlm-deepseek-vl.yaml"):
    return shipped_case_job(cases, case_id)


def test_the_trace_of_today_agrees_with_the_estimate():
    estimate_holds_vision_trace(_job("dsvl384-full-nogc"), 3.0)


def test_the_collator_fills_the_row_with_the_images_tokens():
    job = _job("dsvl384-full-nogc")
    proc, batch = collated_image_row(job, 1024)
    ids = batch["input_ids"][0]
    assert ids.shape == (1024,)
    assert int((ids == proc.image_token_id).sum()) == (384 // 16) ** 2
    assert tuple(batch["pixel_values"].shape) == (1, 3, 384, 384)


def test_the_preference_collator_runs_each_image_for_chosen_and_rejected():
    from trl.trainer.dpo_trainer import DataCollatorForVisionPreference

    from hpcmem.trace.data import BatchDesign
    from hpcmem.trace.vision import processor
    from hpcmem.trace.vision_pref import make_vision_preference_dataset

    job = _job("dsvl-dpo-full-gc-512", "vlm-deepseek-vl-dpo.yaml")
    proc = processor(job)
    rows = make_vision_preference_dataset(job, BatchDesign(layout="padded", documents=(1536,), batch_shape=(2, 1536),
                                                        tokens=2 * 1536, note=""), 1)
    batch = DataCollatorForVisionPreference(processor=proc, max_length=1536)([dict(rows[0])])
    assert tuple(batch["pixel_values"].shape) == (2, 3, 512, 512)
    assert batch["input_ids"].shape[0] == 2
    assert int((batch["input_ids"] == proc.image_token_id).sum()) == 2 * (512 // 16) ** 2

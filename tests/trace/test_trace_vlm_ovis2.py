"""Ovis2 traced now against its estimate: TRL's SFTTrainer with its vision collator and transformers' Ovis2Processor
on real 480×640 images resized to 448 px, Ovis2-2B's widths cut to 1 decoder layer and 2 tower layers
(estimator/cases/vlm-ovis2.yaml), full fine-tuning without checkpointing and LoRA all-linear without it on four
images: the step's peak and the tower's own backward within 3 %. And what TRL's collators hand the model: each image's <IMG_START>, 256 <IMG_ATOM> tokens, <IMG_GRID> and
<IMG_END>, and the words; DPO's preference collator each image for chosen and rejected."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from tests.helpers.trace_helpers import estimate_holds_vision_trace, shipped_case_job  # noqa: E402

pytestmark = pytest.mark.torch


def _job(case_id: str, cases: str = "vlm-ovis2.yaml"):
    return shipped_case_job(cases, case_id)


@pytest.mark.parametrize("case_id", ["ovis448-full-nogc", "ovis448-4img-lora-all-nogc"])
def test_the_trace_of_today_agrees_with_the_estimate(case_id):
    estimate_holds_vision_trace(_job(case_id), 3.0)


def test_the_collator_fills_the_row_with_the_images_tokens():
    from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling

    from hpcmem.trace.vision import make_image_dataset, processor, token_ids

    job = _job("ovis448-4img-full-nogc")
    proc = processor(job)
    ids_of = token_ids(proc)
    row = dict(make_image_dataset(job, (1536,), 1)[0])
    batch = DataCollatorForVisionLanguageModeling(processor=proc)([row])
    ids = batch["input_ids"][0]
    assert ids.shape == (1536,)
    assert int((ids == ids_of["image_token_id"]).sum()) == 4 * (448 // 14 // 2) ** 2
    start, grid, col, row_, end = ids_of["visual_indicator_token_ids"]
    assert [int((ids == t).sum()) for t in (start, grid, col, row_, end)] == [4, 4, 0, 0, 4]
    assert tuple(batch["pixel_values"].shape) == (4, 3, 448, 448)


def test_the_preference_collator_runs_each_image_for_chosen_and_rejected():
    from trl.trainer.dpo_trainer import DataCollatorForVisionPreference

    from hpcmem.trace.data import BatchDesign
    from hpcmem.trace.vision import processor, token_ids
    from hpcmem.trace.vision_pref import make_vision_preference_dataset

    job = _job("ovis-dpo-full-gc-560", "vlm-ovis2-dpo.yaml")
    proc = processor(job)
    rows = make_vision_preference_dataset(job, BatchDesign(layout="padded", documents=(768,), batch_shape=(2, 768),
                                                        tokens=2 * 768, note=""), 1)
    batch = DataCollatorForVisionPreference(processor=proc, max_length=768)([dict(rows[0])])
    assert tuple(batch["pixel_values"].shape) == (2, 3, 560, 560)
    assert batch["input_ids"].shape[0] == 2
    assert int((batch["input_ids"] == token_ids(proc)["image_token_id"]).sum()) == 2 * (560 // 14 // 2) ** 2

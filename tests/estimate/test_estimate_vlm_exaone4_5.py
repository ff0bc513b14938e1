"""EXAONE 4.5 SFT with images on a learned text part (tests/fixtures/vlm/exaone4_5-defaults-L2-D2.json: two EXAONE 4
layers of the text config class's widths, their terms from the learned profile in hpcmem/profiles/; Qwen2.5-VL's tower
with grouped-query attention cut to 2 blocks) against the trace of TRL's SFTTrainer with its vision collator and
transformers' Exaone4_5_Processor on blank 448×448 and 896×672 images (estimator/traces/vlm-exaone4-5.jsonl, written
once by `hpcmem validate trace --cases estimator/cases/vlm-exaone4-5.yaml`, the estimate untouched after)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.validate.cases import case_job
from tests.helpers.stored_cases import assert_learned_case_holds, trace_records

ROOT = Path(__file__).resolve().parents[2]
RECORDS = trace_records(ROOT, "vlm-exaone4-5")
CUT = "tests/fixtures/vlm/exaone4_5-defaults-L2-D2.json"


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    assert_learned_case_holds(RECORDS[case_id], ROOT)


def test_the_matrix_is_all_there():
    assert len(RECORDS) == 8 + 4
    assert {(r["case"]["image_height"], r["case"]["image_width"]) for r in RECORDS.values()} == {(448, 448),
                                                                                               (672, 896)}
    assert {r["cell"] for r in RECORDS.values()} == {f"{t}/{c}" for t in ("sft", "dpo")
                                                     for c in ("full+gc", "full+nogc", "lora+gc", "lora+nogc")}


def test_the_grouped_tower_keeps_less_than_an_ungrouped_one():
    """k and v of 8 heads, not 16: the tower's saved attention tensors are smaller than with every head a key/value
    head (the same job with num_key_value_heads = num_heads)."""
    import dataclasses

    job = case_job({**RECORDS["ex45-full-nogc-896"]["case"]})
    ungrouped = dataclasses.replace(job, model=dataclasses.replace(
        job.model, vision=dataclasses.replace(job.model.vision, num_key_value_heads=16)))
    grouped, every = (max(c.bytes for p in estimate(j).phases for c in p.components if c.name == "vision activations")
                      for j in (job, ungrouped))
    assert grouped < every


@pytest.mark.parametrize("trainer", ["kto"])
def test_other_trainers_with_images_are_refused(trainer):
    settings = {"model_name_or_path": CUT, "dtype": "bfloat16", "images_per_example": 1, "image_height": 448,
                "image_width": 448}
    with pytest.raises(SpecError, match="image"):
        case_job({"trainer": trainer, **settings, **({"max_length": 1536} if trainer == "kto" else {})})

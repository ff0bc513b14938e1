"""Step 3.7 Flash SFT and DPO with images on a learned text part (tests/fixtures/vlm/step3p7-defaults-L2-D2.json: two
step3p5 layers of the text config class's widths, both dense under the default MoE layers 3.., sliding_window 512,
their terms from the learned profile in hpcmem/profiles/; Step3p7VisionConfig's tower cut to 2 layers, its two
Conv2d downsamplers and the Linear projector) against the trace of TRL's SFTTrainer and DPOTrainer with their vision
collators and transformers' Step3p7Processor on blank 728×728 (the global view only) and 1008×1008 (the global view
and 2 × 2 local crops) images (estimator/traces/vlm-step3p7.jsonl, written once by
`hpcmem validate trace --cases estimator/cases/vlm-step3p7.yaml`). Every case holds within 3 % (estimator/LOG.md); one
fix after the trace, in-sample: the tower's passes get no attention mask, so no padding bias is counted."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.validate.cases import case_job
from tests.helpers.stored_cases import assert_learned_case_holds, grpo_with_images_job, largest_component, trace_records

ROOT = Path(__file__).resolve().parents[2]
RECORDS = trace_records(ROOT, "vlm-step3p7")
# two more crop layouts, traced after the matrix (estimator/cases/vlm-step3p7-crops.yaml): 504×1008 (2 × 1 crops) and
# 1512×1512 (3 × 3)
CROPS = trace_records(ROOT, "vlm-step3p7-crops")
CUT = "tests/fixtures/vlm/step3p7-defaults-L2-D2.json"


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    assert_learned_case_holds(RECORDS[case_id], ROOT)


@pytest.mark.parametrize("case_id", sorted(CROPS))
def test_more_crop_layouts_within_3_percent_of_the_trace(case_id):
    assert_learned_case_holds(CROPS[case_id], ROOT)


def test_the_crop_layouts_are_there():
    assert {(r["case"]["image_height"], r["case"]["image_width"]) for r in CROPS.values()} == {(504, 1008),
                                                                                             (1512, 1512)}
    assert len(CROPS) == 4


def test_the_matrix_is_all_there():
    assert len(RECORDS) == 8 + 4
    assert {(r["case"]["image_height"], r["case"]["image_width"]) for r in RECORDS.values()} == {(728, 728),
                                                                                               (1008, 1008)}
    assert {r["cell"] for r in RECORDS.values()} == {f"{t}/{c}" for t in ("sft", "dpo")
                                                     for c in ("full+gc", "full+nogc", "lora+gc", "lora+nogc")}


def test_checkpointed_layers_keep_their_input_alone():
    """modular_step3p7.py `Step3p7VisionEncoderLayer` is a GradientCheckpointingLayer: under checkpointing each of the
    two layers keeps its bf16 inputs of both passes, 2 · 1536 bytes a patch: at 1008×1008 the global view's 52² = 2,704
    patches and four 504-px crops' 36² = 1,296 each, 7,888 patches; 169 + 4 · 81 = 493 image tokens (the grids halved
    twice by the stride-2 downsamplers: 13² and 9²)."""
    from hpcmem.estimate.lora import LoraLayout
    from hpcmem.estimate.vision_step3p7 import step3p7_terms
    from hpcmem.job.shape import precision

    job = case_job({**RECORDS["step3p7-full-gc-1008"]["case"]})
    terms = step3p7_terms(job, precision(job), LoraLayout(enabled=False))
    assert terms.blocks_saved == (2 * 1536 * 7888,) * 2
    assert terms.image_tokens == 493 and terms.patches == 7888


def test_images_add_to_the_estimate():
    job = case_job({**RECORDS["step3p7-full-nogc-1008"]["case"]})
    assert largest_component(estimate(job), "vision activations") > 0


def test_grpo_with_images_is_refused():
    """SFT and DPO with images are traced (above); GRPO and RLOO with images are not: refused."""
    with pytest.raises(SpecError, match="with trainer grpo on step3p7: hpcmem models step3p7's images for "
                                        "sft, dpo only"):
        estimate(grpo_with_images_job(ROOT / CUT, 728, 728))

"""MiniCPM-V 4.7 SFT and DPO with images on a learned text part (tests/fixtures/vlm/minicpmv4-7-defaults-L2-D2.json:
two Qwen3.5 layers of the text config class's widths, their terms from the learned profile in hpcmem/profiles/;
MiniCPMV4_7VisionConfig's (4.6's) tower cut to 2 layers with the window-attention merger after the first, then the
MLP merger; hpcmem.models.minicpmv4_7) against the trace of TRL's SFTTrainer and DPOTrainer with their vision
collators and transformers' MiniCPMV4_7Processor (mm_token_type_ids passed on; MiniCPMV4_7Model's canvas M-RoPE
position ids) on blank 448×448 and 896×672 images (estimator/traces/vlm-minicpmv4-7.jsonl, written once by
`hpcmem validate trace --cases estimator/cases/vlm-minicpmv4-7.yaml`, the estimate untouched after)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.validate.cases import case_job
from tests.helpers.stored_cases import assert_learned_case_holds, grpo_with_images_job, largest_component, trace_records

ROOT = Path(__file__).resolve().parents[2]
RECORDS = trace_records(ROOT, "vlm-minicpmv4-7")
CUT = "tests/fixtures/vlm/minicpmv4-7-defaults-L2-D2.json"


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    assert_learned_case_holds(RECORDS[case_id], ROOT)


def test_the_matrix_is_all_there():
    assert len(RECORDS) == 8 + 4
    assert {(r["case"]["image_height"], r["case"]["image_width"]) for r in RECORDS.values()} == {(448, 448),
                                                                                               (672, 896)}
    assert {r["cell"] for r in RECORDS.values()} == {f"{t}/{c}" for t in ("sft", "dpo")
                                                     for c in ("full+gc", "full+nogc", "lora+gc", "lora+nogc")}


def test_the_window_merger_quarters_the_later_layers():
    """modular_minicpmv4_6.py `MiniCPMV4_6VisionModel.forward` (MiniCPMV4_7Model builds the same tower,
    modular_minicpmv4_7.py): after layer insert_layer_id the window merger leaves N / 4 rows, so under checkpointing the second layer's input is a quarter of the first's (3,840 patches at
    896×672, bf16, width 768)."""
    from hpcmem.estimate.lora import LoraLayout
    from hpcmem.estimate.vision_minicpmv4_6 import minicpmv4_6_terms
    from hpcmem.job.shape import precision

    job = case_job({**RECORDS["mcv47-full-gc-896"]["case"]})
    terms = minicpmv4_6_terms(job, precision(job), LoraLayout(enabled=False))
    assert terms.blocks_saved == (2 * 768 * 3840, 2 * 768 * 960)
    assert terms.image_tokens == 240


def test_images_add_to_the_estimate():
    job = case_job({**RECORDS["mcv47-full-nogc-896"]["case"]})
    assert largest_component(estimate(job), "vision activations") > 0


def test_grpo_with_images_is_refused():
    """SFT and DPO with images hold (the stored traces above); GRPO and RLOO with images are not traced: refused."""
    with pytest.raises(SpecError, match="with trainer grpo on minicpmv4_7: hpcmem models minicpmv4_7's images for "
                                        "sft, dpo only"):
        estimate(grpo_with_images_job(ROOT / CUT, 448, 448))

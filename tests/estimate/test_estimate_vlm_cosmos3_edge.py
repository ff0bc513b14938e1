"""Cosmos3 Edge SFT and DPO with images on a learned text part (tests/fixtures/vlm/cosmos3-edge-defaults-L2-D2.json:
two cosmos3_edge_text layers of the text config class's widths, their terms from the learned profile in
hpcmem/profiles/; Cosmos3EdgeVisionConfig's SigLIP2 tower cut to 2 layers under the 2 × 2 patch merger) against the
trace of TRL's SFTTrainer and DPOTrainer with their vision collators and transformers' Cosmos3EdgeProcessor on blank
448×448 and 896×672 images (estimator/traces/vlm-cosmos3-edge.jsonl, written once by `hpcmem validate trace --cases
estimator/cases/vlm-cosmos3-edge.yaml --reserved`, the estimate untouched after)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.estimate.lora import LoraLayout
from hpcmem.estimate.vision_cosmos3_edge import merger_saved
from hpcmem.job.shape import Precision
from hpcmem.validate.cases import case_job
from tests.helpers.stored_cases import assert_learned_case_holds, grpo_with_images_job, trace_records

ROOT = Path(__file__).resolve().parents[2]
RECORDS = trace_records(ROOT, "vlm-cosmos3-edge")
CUT = "tests/fixtures/vlm/cosmos3-edge-defaults-L2-D2.json"


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    assert_learned_case_holds(RECORDS[case_id], ROOT)


def test_the_matrix_is_all_there():
    assert len(RECORDS) == 8 + 4
    assert {(r["case"]["image_height"], r["case"]["image_width"]) for r in RECORDS.values()} == {(448, 448),
                                                                                               (672, 896)}
    assert {r["cell"] for r in RECORDS.values()} == {f"{t}/{c}" for t in ("sft", "dpo")
                                                     for c in ("full+gc", "full+nogc", "lora+gc", "lora+nogc")}


def test_the_merger_keeps_last_hidden_state_once():
    """modular_cosmos3_edge.py `Cosmos3EdgePatchMerger.forward` runs its LayerNorm on last_hidden_state itself
    (post_layernorm's fp32 output under autocast): that tensor is counted once beside post_layernorm's input and the
    two norms' statistics; trained, linear_fc1's input (the norm's bf16 output) and both GELU tensors [N / 4, 11520]
    besides."""
    job = case_job({**RECORDS["c3edge-full-nogc-896"]["case"], "model_name_or_path": str(ROOT / CUT)})
    v, n = job.model.vision, 2352
    prec = Precision(weight=2, act=2, residual=2, autocast=False, amp=True)
    stats = 8 * n
    frozen = (4 * 1152 * n + stats) + 4 * 1152 * n + stats + 2 * 11520 * (n // 4)
    off = LoraLayout(enabled=False)
    assert merger_saved(v, n, prec, trained=False, adapted=[], lora=off) == frozen
    assert merger_saved(v, n, prec, trained=True, adapted=[], lora=off) == frozen + 2 * 1152 * n + 2 * 11520 * (n // 4)


def test_grpo_with_images_is_refused():
    """SFT and DPO with images hold (the stored traces above); GRPO and RLOO with images are not traced: refused."""
    with pytest.raises(SpecError, match="with trainer grpo on cosmos3_edge: hpcmem models cosmos3_edge's images for "
                                        "sft, dpo only"):
        estimate(grpo_with_images_job(ROOT / CUT, 448, 448))

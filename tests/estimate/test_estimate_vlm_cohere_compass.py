"""Cohere Compass (cohere_compass) SFT and DPO with images (tests/fixtures/vlm/cohere-compass-L2-D2.json: Qwen3-VL's
tower cut to 2 blocks and one deepstack merger, a 2-layer text part whose terms come from its learned profile) against
the traces of TRL's SFTTrainer / DPOTrainer with their vision collators and CohereCompassProcessor
(estimator/traces/vlm-cohere-compass.jsonl, written by `hpcmem validate trace --cases
estimator/cases/vlm-cohere-compass.yaml` before the estimate was compared with it); what is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from tests.helpers.stored_cases import (SIX_CELLS, assert_matrix, estimated_tensor_peak, grpo_with_images_job,
                                       sft_with_images_job, trace_records)

ROOT = Path(__file__).resolve().parents[2]
RECORDS = trace_records(ROOT, "vlm-cohere-compass")
CUT = ROOT / "tests" / "fixtures" / "vlm" / "cohere-compass-L2-D2.json"


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    record = RECORDS[case_id]
    assert abs(estimated_tensor_peak(record, ROOT) - record["traced"]) <= 0.03 * record["traced"]


def test_the_matrix_spans_two_resolutions_and_both_trainers():
    assert_matrix(RECORDS, 10, {(512, 512), (768, 1024)}, (512, 512), SIX_CELLS)


def test_the_estimate_names_the_tower_and_the_learned_decoder():
    e = estimate(sft_with_images_job(CUT, 768, 1024))
    assert {"vision tower weights", "vision activations"} <= {c.name for p in e.phases for c in p.components}
    # 1024×768 at 16 px patches, merged 2 × 2: a 64 × 48 grid, 3,072 patches, 768 image tokens
    assert "3,072 patches, 768 image tokens" in e.summary
    assert any("learned profile" in c.note for p in e.phases for c in p.components)


def test_grpo_with_images_is_refused():
    with pytest.raises(SpecError, match="sft, dpo only"):
        estimate(grpo_with_images_job(CUT, 448, 448))

"""GLM-OCR (glm_ocr) SFT and DPO with images (tests/fixtures/vlm/glm-ocr-L2-D4.json: the config classes' defaults, the
text part at the width the merger hands it, cut to 2 text layers and 4 vision blocks) against the traces of TRL's
SFTTrainer / DPOTrainer with their vision collators and Glm46VProcessor (estimator/traces/vlm-glm-ocr.jsonl, written
by `hpcmem validate trace --cases estimator/cases/vlm-glm-ocr.yaml` before the estimate was compared with it); what
is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from tests.helpers.stored_cases import (SIX_CELLS, assert_matrix, estimated_tensor_peak, grpo_with_images_job,
                                       sft_with_images_job, trace_records)

ROOT = Path(__file__).resolve().parents[2]
RECORDS = trace_records(ROOT, "vlm-glm-ocr")
CUT = ROOT / "tests" / "fixtures" / "vlm" / "glm-ocr-L2-D4.json"


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    record = RECORDS[case_id]
    assert abs(estimated_tensor_peak(record, ROOT) - record["traced"]) <= 0.03 * record["traced"]


def test_the_matrix_spans_two_resolutions_and_both_trainers():
    assert_matrix(RECORDS, 10, {(512, 512), (768, 1024)}, (512, 512), SIX_CELLS)


def test_the_estimate_names_the_tower_and_the_image_tokens():
    e = estimate(sft_with_images_job(CUT, 768, 1024))
    names = {c.name for p in e.phases for c in p.components}
    assert {"vision tower weights", "vision activations"} <= names
    # 1,024×768 → smart_resize 1,036×756 (multiples of 28): 37 × 27 merged tokens of 2×2 patches
    assert "3,996 patches, 999 image tokens" in e.summary


def test_grpo_with_images_is_refused():
    """SFT and DPO with images hold (the stored traces); GRPO and RLOO with images are not traced: refused."""
    with pytest.raises(SpecError, match="sft, dpo only"):
        estimate(grpo_with_images_job(CUT, 448, 448))

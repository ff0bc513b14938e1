"""GLM-4.6V (glm46v) and glmga SFT with images (tests/fixtures/vlm/glm46v-defaults-L2-D2.json and
glmga-defaults-L2-D2.json: the config classes' defaults cut to 2 text layers and 2 vision blocks) against the traces
of TRL's SFTTrainer with its vision collator and Glm46VProcessor (estimator/traces/vlm-glm46v.jsonl and vlm-glmga.jsonl,
written by `hpcmem validate trace --cases estimator/cases/vlm-<type>.yaml`); what is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from tests.helpers.stored_cases import estimated_tensor_peak, grpo_with_images_job, trace_records

ROOT = Path(__file__).resolve().parents[2]
RECORDS = trace_records(ROOT, "vlm-glm46v", "vlm-glmga")


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    record = RECORDS[case_id]
    assert abs(estimated_tensor_peak(record, ROOT) - record["traced"]) <= 0.03 * record["traced"]


def test_the_matrices_are_all_there():
    sizes = {(r["case"]["model_name_or_path"].rsplit("/", 1)[1].split("-")[0], r["case"]["image_height"],
              r["case"]["image_width"]) for r in RECORDS.values()}
    assert len(RECORDS) == 14 + 4 and sizes == {("glm46v", 512, 512), ("glm46v", 600, 800), ("glmga", 672, 896),
                                            ("glmga", 512, 512)}
    assert {r["cell"] for r in RECORDS.values()} == {"sft/full+gc", "sft/full+nogc", "sft/lora+gc", "sft/lora+nogc",
                                                     "dpo/full+nogc", "dpo/lora+gc"}


@pytest.mark.parametrize("model_type", ["glm46v", "glmga"])
def test_grpo_with_images_is_refused(model_type):
    """DPO with images holds (the stored DPO traces); GRPO and RLOO with images are not traced: refused."""
    cut = ROOT / "tests" / "fixtures" / "vlm" / f"{model_type}-defaults-L2-D2.json"
    with pytest.raises(SpecError, match="sft, dpo only"):
        estimate(grpo_with_images_job(cut, 448, 448))

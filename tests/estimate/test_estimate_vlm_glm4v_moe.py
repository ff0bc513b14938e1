"""GLM-4.5V (glm4v_moe) SFT and DPO with images (tests/fixtures/vlm/glm4v-moe-L2-D2.json: glm4v's tower cut to 2
blocks over a 2-layer cut of GLM-4.5's MoE decoder, learned as glm4_moe's layers) against the traces of TRL's
SFTTrainer / DPOTrainer with their vision collators and Glm4vProcessor (estimator/traces/vlm-glm4v-moe.jsonl, written
by `hpcmem validate trace --cases estimator/cases/vlm-glm4v-moe.yaml` before the estimate was compared with it); the
refusals: the default router_aux_loss_coef (TRL 1.16 raises), all-linear LoRA at TRL's dropout (peft raises), GRPO."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.validate.cases import case_job
from tests.helpers.stored_cases import (SIX_CELLS, assert_matrix, estimated_tensor_peak, grpo_with_images_job,
                                       trace_records)

ROOT = Path(__file__).resolve().parents[2]
RECORDS = trace_records(ROOT, "vlm-glm4v-moe")
# GLM-4.6V as released: glm46v over a glm4v_moe_text sub-config, the same decoder (estimator/cases/vlm-glm46v-moe.yaml)
GLM46V_MOE = trace_records(ROOT, "vlm-glm46v-moe")
CUT = ROOT / "tests" / "fixtures" / "vlm" / "glm4v-moe-L2-D2.json"
JOB = {"trainer": "sft", "model_name_or_path": str(CUT), "dtype": "bfloat16", "bf16": True, "max_length": 1024,
       "images_per_example": 1, "image_height": 448, "image_width": 448}


@pytest.mark.parametrize("case_id", sorted(RECORDS) + sorted(GLM46V_MOE))
def test_estimate_within_3_percent_of_the_trace(case_id):
    record = {**RECORDS, **GLM46V_MOE}[case_id]
    assert abs(estimated_tensor_peak(record, ROOT) - record["traced"]) <= 0.03 * record["traced"]


def test_the_matrix_spans_two_resolutions_and_both_trainers():
    assert_matrix(RECORDS, 10, {(448, 448), (480, 640)}, (448, 448), SIX_CELLS)


@pytest.mark.parametrize("coef", [None, 0.0001, 0.01])
def test_a_load_balancing_loss_is_refused(coef, tmp_path):
    """The config class's 0.0001 (the fixture names 0) or the job's own: TRL 1.16's fused head raises
    (tests/trace/test_trace_vlm_glm4v_moe.py runs it)."""
    import json

    cfg = json.loads(CUT.read_text())
    cfg["text_config"].pop("router_aux_loss_coef")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    settings = {**JOB, "model_name_or_path": str(path), **({} if coef is None else {"router_aux_loss_coef": coef})}
    with pytest.raises(SpecError, match="router_aux_loss_coef .*text_config.num_experts"):
        estimate(case_job(settings))
    estimate(case_job({**JOB, "router_aux_loss_coef": 0}))      # the fixture's own 0 and an explicit 0 run


def test_all_linear_lora_at_trls_dropout_is_refused_as_peft_refuses_it():
    with pytest.raises(SpecError, match="ParamWrapper does not work with lora_dropout != 0"):
        estimate(case_job({**JOB, "use_peft": True, "lora_target_modules": "all-linear"}))


def test_grpo_with_images_is_refused():
    with pytest.raises(SpecError, match="sft, dpo only"):
        estimate(grpo_with_images_job(CUT, 448, 448))


def test_glm46v_over_the_moe_decoder_takes_the_same_profile_and_rule(tmp_path):
    """glm46v with a glm4v_moe_text sub-config: the same text part (one learned profile serves both), and the same
    refusal of a load-balancing loss."""
    import json

    from hpcmem.models.vision import text_part

    glm46v = ROOT / "tests" / "fixtures" / "vlm" / "glm46v-moe-L2-D2.json"
    assert len(GLM46V_MOE) == 5
    same = {**text_part(json.loads(glm46v.read_text()))}
    assert same == text_part(json.loads(CUT.read_text())) and "router_aux_loss_coef" not in same
    estimate(case_job({**JOB, "model_name_or_path": str(glm46v)}))
    with pytest.raises(SpecError, match="router_aux_loss_coef 0.01: on glm46v"):
        estimate(case_job({**JOB, "model_name_or_path": str(glm46v), "router_aux_loss_coef": 0.01}))

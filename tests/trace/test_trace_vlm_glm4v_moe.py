"""GLM-4.5V (glm4v_moe) traced now: the estimate of a LoRA job on the cut of estimator/cases/vlm-glm4v-moe.yaml holds
against TRL's SFTTrainer on the real classes; and with the text config's default router_aux_loss_coef (0.0001) the
real trainer raises in TRL 1.16's fused LM head, which is why hpcmem refuses it (hpcmem.job.image_rules `aux_loss_problems`)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("trl")

from tests.helpers.trace_helpers import shipped_case_job  # noqa: E402

pytestmark = pytest.mark.torch


def test_the_trace_of_today_agrees_with_the_estimate():
    from hpcmem.estimate import estimate
    from hpcmem.estimate.workspaces import tensor_bytes
    from hpcmem.trace.run import run_trace

    job = shipped_case_job("vlm-glm4v-moe.yaml", "g45v640-lora-attn-gc")
    traced = run_trace(job, kernels="cuda").peak_allocated_bytes
    assert abs(max(tensor_bytes(p) for p in estimate(job).phases) - traced) <= 0.03 * traced


def test_the_default_load_balancing_loss_fails_in_trl(tmp_path):
    from hpcmem.trace.run import run_trace
    from hpcmem.validate.random_trace import trl_rules_off

    from pathlib import Path

    cut = Path(__file__).resolve().parents[1] / "fixtures" / "vlm" / "glm4v-moe-L2-D2.json"
    cfg = json.loads(cut.read_text())
    cfg["text_config"].pop("router_aux_loss_coef")       # the config class's 0.0001
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with trl_rules_off():
        from hpcmem.validate.cases import case_job

        job = case_job({"trainer": "sft", "model_name_or_path": str(path), "dtype": "bfloat16", "bf16": True,
                        "max_length": 1024, "images_per_example": 1, "image_height": 448, "image_width": 448})
        with pytest.raises(AttributeError, match="num_experts"):
            run_trace(job, kernels="cuda")

"""The trace beyond SFT: for DPO (each reference-model mode) and the reward trainer, `run_trace(..., kernels="cpu")`
on fake tensors counts the same peak as a REAL two-step run of TRL's own trainer on the CPU (tiny model, same
StorageTracker) — the proof that the fake world runs the path a real run takes. Cases files build as jobs."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("trl")

from hpcmem.job.jobspec import JobSpec
from hpcmem.job.spec import TrainSpec
from hpcmem.validate.cases import case_job
from tests.helpers.trace_helpers import TINY_LLAMA, trace_matches_cpu  # noqa: E402

pytestmark = pytest.mark.torch

CASES_DIR = Path(__file__).resolve().parents[2] / "estimator" / "cases"


def tiny_job(trainer: str, **train) -> JobSpec:
    model = TINY_LLAMA
    settings = {"max_length": 64, "per_device_train_batch_size": 2, **train}
    return JobSpec(model=model, train=TrainSpec(trainer=trainer, **settings))


CASES = {
    "dpo-ref-model": ("dpo", {}),
    "dpo-ref-model-gc-off": ("dpo", {"gradient_checkpointing": False}),
    "dpo-peft-no-ref": ("dpo", {"use_peft": True, "lora_r": 8}),
    "dpo-precompute": ("dpo", {"precompute_ref_log_probs": True}),
    "dpo-optimizer-peak": ("dpo", {"optim": "adamw_torch", "max_length": 8, "per_device_train_batch_size": 1}),
    "reward-full": ("reward", {}),
    "reward-lora": ("reward", {"use_peft": True, "lora_r": 8, "lora_task_type": "SEQ_CLS",
                               "gradient_checkpointing": False}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_trace_matches_a_real_cpu_run(case):
    trainer, settings = CASES[case]
    job = tiny_job(trainer, **dict(settings))
    real, traced = trace_matches_cpu(job, case)
    assert traced.batch["shape"] == [4, 64] or case == "dpo-optimizer-peak"
    if case == "dpo-optimizer-peak":
        assert "optimizer" in real.phase


def test_dpo_reference_forward_is_a_phase_and_the_reference_is_counted():
    from hpcmem.trace import run_trace

    job = tiny_job("dpo", max_length=16, per_device_train_batch_size=1)
    with_ref = run_trace(job, kernels="cpu", timeline=True)
    assert any(p.phase.startswith("step 2 / forward / reference forward") for p in with_ref.timeline)
    precomputed = run_trace(tiny_job("dpo", max_length=16, per_device_train_batch_size=1,
                                     precompute_ref_log_probs=True), kernels="cpu")
    # the second model's weights (fp32 here) are the difference in parameters
    assert with_ref.components["param"] > precomputed.components["param"]
    assert any("precompute_ref_log_probs" in n for n in precomputed.reimplemented)


@pytest.mark.parametrize("name", ["dpo", "reward"])
def test_case_files_build_and_are_traceable(name):
    from hpcmem.job.trl_config import read_yaml
    from hpcmem.trace.trainer import check_traceable

    data = read_yaml(CASES_DIR / f"{name}.yaml")
    ids = [c["id"] for c in data["cases"]]
    assert len(ids) == len(set(ids))
    assert sum(bool(c.get("ci")) for c in data["cases"]) >= 4
    for case in data["cases"]:
        job = case_job(case)
        assert job.train.trainer == name
        assert not check_traceable(job), (case["id"], check_traceable(job))

"""The planner answers for every trainer in the registry, and a combination of the job's own knobs is the job: what
no knob turns (a distillation teacher, the job's environment) is kept, so its estimate is the job's."""

from __future__ import annotations

import pytest

from hpcmem.cli.options import job_from_cli
from hpcmem.estimate import estimate
from hpcmem.job.trainers import names
from hpcmem.plan import search
from hpcmem.plan.knobs import apply, job_knobs

SMALL = {"model_name_or_path": "Qwen/Qwen2.5-0.5B", "gpu": "H100-80GB"}
EXTRA = {"distillation": {"teacher_model_name_or_path": "Qwen/Qwen2.5-1.5B"}}


@pytest.mark.parametrize("trainer", names())
def test_the_planner_answers_for_every_trainer(trainer):
    job, _ = job_from_cli(trainer, {**SMALL, **EXTRA.get(trainer, {})}, settle_required=True)
    report = search(job, job.gpu, top=2)
    assert report.plans, trainer
    assert all(p.job.teacher == job.teacher for p in report.plans)


@pytest.mark.parametrize("trainer, env", [("distillation", None), ("sft", {"NCCL_NVLS_ENABLE": "0",
                                                                          "CUBLAS_WORKSPACE_CONFIG": ":4096:2"})])
def test_the_jobs_own_knobs_give_back_the_jobs_estimate(trainer, env):
    settings = {**SMALL, "num_processes": 8, "accelerate_config": "fsdp2", **EXTRA.get(trainer, {})}
    job, _ = job_from_cli(trainer, settings, env=env)
    again = apply(job, job_knobs(job))
    assert again.teacher == job.teacher and again.env == job.env
    a, b = estimate(job), estimate(again)
    assert (a.peak_allocated_bytes, a.device_peak_bytes) == (b.peak_allocated_bytes, b.device_peak_bytes)

"""A trace-matrix case (estimator/cases/*.yaml): its keys beside the TRL settings, and the job it describes."""

from __future__ import annotations

from typing import Any

from hpcmem.job.jobspec import JobSpec
from hpcmem.job.trl_config import build_job

CASE_KEYS = ("id", "trainer", "ci", "trace_generation")


def case_job(case: dict[str, Any]) -> JobSpec:
    settings = {k: v for k, v in case.items() if k not in CASE_KEYS}
    return build_job(case["trainer"], settings)[0]

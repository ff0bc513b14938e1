"""The planner's speed for one job as it is (no search): what `hpcmem validate probes --speed` holds to
timed probe runs (stdlib; the same code path, memo and constants the planner ranks with)."""

from __future__ import annotations

from dataclasses import asdict

from hpcmem.gpus.spec import GpuSpec
from hpcmem.job.jobspec import JobSpec
from hpcmem.plan.best_first import Speeds
from hpcmem.plan.knobs import job_knobs
from hpcmem.plan.throughput import Throughput


def job_throughput(job: JobSpec, gpu: GpuSpec) -> Throughput:
    """The throughput model's answer for `job` on `gpu` (its fitted MFU curve when the GPU has one)."""
    return Speeds(job, gpu)(job_knobs(job), asdict(job.parallel))

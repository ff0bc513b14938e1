"""Instrument 2: run N real steps of the real TRL trainer on cuda or cpu and record the peaks.

`run_probe(job, ...)` estimates first, measures (one process, or one worker per rank for multi-process jobs), and
appends one JSON line to `estimator/probes/<gpu>.jsonl`. Heavy packages load inside the functions that need them.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from hpcmem.errors import HpcmemError
from hpcmem.gpus.lookup import gpu_for_device
from hpcmem.probe.dist import run_ranks
from hpcmem.probe.runner import estimate_before, make_record, measure, quiet
from hpcmem.record import append_record, expandable_in_env, records_path


def run_probe(job: Any, *, device: str = "cpu", steps: int = 3, warmup_steps: int = 1,
              capacity_bytes: int | None = None, out: str | Path | None = None, write: bool = True,
              after: tuple[str, ...] = ()) -> Any:
    """Estimate, run, record. Returns the Record (hpcmem.record); `write=False` keeps it out of the records file,
    else it is appended to `record_file(record, out)`. `after`: phases of the job to run once training is done, each
    measured on its own ("evaluation", "checkpoint save")."""
    if steps <= warmup_steps:
        raise ValueError(f"steps ({steps}) must exceed warmup_steps ({warmup_steps}): the peak is taken after warm-up")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be cpu or cuda, got {device!r}")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise HpcmemError("no CUDA device here: probe on a GPU node, or use --device cpu with a tiny model")
    job = align_allocator(job, device)
    if device == "cuda" and job.gpu is None:
        job = on_this_gpu(job)
    started = time.time()
    estimate, estimate_error = estimate_before(job)
    if job.parallel.world_size > 1 or job.parallel.deepspeed:
        # DeepSpeed initialises torch.distributed even for one process, from the torchrun variables (RANK,
        # MASTER_ADDR, …) that run_ranks sets: a single-GPU ZeRO run is a world of one worker
        measured = run_ranks(job, device=device, steps=steps, warmup_steps=warmup_steps,
                             capacity_bytes=capacity_bytes, after=after)
    else:
        quiet()
        measured = measure(job, device=device, steps=steps, warmup_steps=warmup_steps,
                           capacity_bytes=capacity_bytes, after=after)
    record = finished_record(job, measured, estimate=estimate, estimate_error=estimate_error, device=device,
                             steps=steps, warmup_steps=warmup_steps, capacity_bytes=capacity_bytes, started=started)
    if write:
        append_record(record_file(record, out), record)
    return record


def finished_record(job: Any, measured: dict[str, Any], *, estimate: dict[str, Any] | None, estimate_error: str | None,
                    device: str, steps: int, warmup_steps: int, capacity_bytes: int | None, started: float) -> Any:
    """The Record of a measurement (this process's, or ranks merged by hpcmem.probe.dist); a run that failed or was
    stopped is an HpcmemError naming why (the failing rank's last output), never a record."""
    import dataclasses

    if measured.get("status") in ("error", "aborted"):
        ranks = measured.get("ranks", [])
        tails = [r.get("log_tail", "") for r in ranks if r.get("status") == "error"]
        if tails:
            raise HpcmemError("probe failed (no record written); last output of the failing rank:\n" + tails[0][-3000:])
        reasons = sorted({r.get("reason", "") for r in ranks if r.get("status") == "aborted"})
        raise HpcmemError("probe failed (no record written): " + "; ".join(reasons))
    record = make_record(job, measured=measured, estimate=estimate, estimate_error=estimate_error, device=device,
                         steps=steps, warmup_steps=warmup_steps, capacity_bytes=capacity_bytes, started=started)
    return dataclasses.replace(record, timings={"wall_s": round(time.time() - started, 3),
                                                **(measured.get("timings") or {})})


def record_file(record: Any, out: str | Path | None) -> Path:
    """Where a probe's record goes: `out`, else estimator/probes/<the GPU it ran on>.jsonl (cpu.jsonl on CPU)."""
    return Path(out) if out else records_path(record.gpu_name if record.device != "cpu" else None)


def align_allocator(job: Any, device: str) -> Any:
    """Make the run and its estimate agree on expandable_segments. Asked for in the spec → set in the environment
    before CUDA's allocator starts (the ranks inherit it); set in the environment only → the job is estimated as
    such. (Two H200 records of 2026-11-29 ran under the variable with a spec that said otherwise.)"""
    import dataclasses
    import os

    if device != "cuda":
        return job
    if expandable_in_env(dict(os.environ)):
        return job if job.expandable_segments else dataclasses.replace(job, expandable_segments=True)
    if job.expandable_segments:
        current = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = ",".join(p for p in (current, "expandable_segments:True") if p)
    return job


def on_this_gpu(job: Any) -> Any:
    """A job with no --gpu, probed on CUDA, is estimated for the GPU it runs on (its calibration, its cuBLAS
    workspace size, a fit verdict), when the catalog knows that GPU."""
    import dataclasses

    import torch

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    gpu = gpu_for_device(props.name, int(props.total_memory))
    return dataclasses.replace(job, gpu=gpu) if gpu else job

"""Will the job fit? The estimate against the preset's GPU, and, when it does not, the cheapest changes that would.

A change is tried on a copy of the spec and estimated again; changes are listed in the order that costs the run the
least (allocator setting, then recomputation, then smaller micro-batches with the same effective batch, then more
sharding/offload, then LoRA). Single changes first; when none fits alone, the cumulative chain is tried.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from hpcmem.errors import HpcmemError

if TYPE_CHECKING:
    from hpcmem.spec import JobSpec

GIB = 1024**3


@dataclass(frozen=True)
class Fix:
    flags: str              # what to add to the command line
    device_peak_bytes: int


@dataclass(frozen=True)
class FitReport:
    fits: bool
    device_peak_bytes: int
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    gpu_name: str
    gpu_memory_bytes: int
    estimate_json: dict
    fixes: tuple[Fix, ...] = field(default=())

    def message(self) -> str:
        head = (f"device peak {self.device_peak_bytes / GIB:.1f} GiB per GPU (allocated "
                f"{self.peak_allocated_bytes / GIB:.1f}, reserved {self.peak_reserved_bytes / GIB:.1f}) "
                f"vs {self.gpu_memory_bytes / GIB:.1f} GiB on {self.gpu_name}")
        if self.fits:
            return f"fits: {head}"
        lines = [f"does not fit: {head}"]
        if self.fixes:
            lines.append("cheapest changes that fit:")
            lines += [f"  {f.flags}   → {f.device_peak_bytes / GIB:.1f} GiB" for f in self.fixes]
        else:
            lines.append("no single change tried fits: use a larger GPU, more nodes, or a smaller model")
        lines.append("(--force submits anyway)")
        return "\n".join(lines)


def _estimator() -> Callable:
    from hpcmem.estimate import estimate

    return estimate


def check_fit(job: JobSpec, *, estimator: Callable | None = None, max_fixes: int = 3) -> FitReport:
    """Estimate `job` on its GPU (job.gpu must be set: submit takes it from the preset)."""
    if job.gpu is None:
        raise HpcmemError("no GPU for the fit check: the preset's gpu must be in the catalog (hpcmem gpus)")
    estimate = estimator or _estimator()
    est = estimate(job)
    fits = est.device_peak_bytes <= job.gpu.memory_bytes
    fixes = () if fits else tuple(suggest_fixes(job, estimate, limit=max_fixes))
    return FitReport(fits=fits, device_peak_bytes=est.device_peak_bytes, peak_allocated_bytes=est.peak_allocated_bytes,
                     peak_reserved_bytes=est.peak_reserved_bytes, gpu_name=job.gpu.name,
                     gpu_memory_bytes=job.gpu.memory_bytes, estimate_json=est.to_json(), fixes=fixes)


def _replace(job: JobSpec, train: dict | None = None, parallel: dict | None = None, **top) -> JobSpec:
    t = dataclasses.replace(job.train, **(train or {}))
    p = dataclasses.replace(job.parallel, **(parallel or {}))
    return dataclasses.replace(job, train=t, parallel=p, **top)


def _candidates(job: JobSpec) -> list[tuple[str, Callable[[JobSpec], JobSpec]]]:
    """(flags, change) in order of cost to the run; each change applies to any spec (for the cumulative chain)."""
    t, par = job.train, job.parallel
    out: list[tuple[str, Callable[[JobSpec], JobSpec]]] = []
    if not job.expandable_segments:
        out.append(("--expandable_segments true", lambda j: _replace(j, expandable_segments=True)))
    if not t.gradient_checkpointing:
        out.append(("--gradient_checkpointing true", lambda j: _replace(j, {"gradient_checkpointing": True})))
    bs, ga = t.per_device_train_batch_size, t.gradient_accumulation_steps
    while bs > 1:
        bs, ga = bs // 2, ga * 2
        out.append((f"--per_device_train_batch_size {bs} --gradient_accumulation_steps {ga}",
                    lambda j, bs=bs, ga=ga: _replace(j, {"per_device_train_batch_size": bs,
                                                         "gradient_accumulation_steps": ga})))
    if par.num_processes > 1 and not par.fsdp and (not par.deepspeed or par.zero_stage < 3):
        for stage in (2, 3):
            if not par.deepspeed or par.zero_stage < stage:
                out.append((f"--distributed_type DEEPSPEED --zero_stage {stage}",
                            lambda j, s=stage: _replace(j, parallel={"distributed_type": "DEEPSPEED", "zero_stage": s})))
    if par.deepspeed and par.zero_stage >= 1 and par.offload_optimizer_device == "none":
        out.append(("--offload_optimizer_device cpu", lambda j: _replace(j, parallel={"offload_optimizer_device": "cpu"})))
    if t.trainer in ("sft", "dpo", "reward") and not t.activation_offloading:
        out.append(("--activation_offloading true", lambda j: _replace(j, {"activation_offloading": True})))
    if not t.use_peft:
        out.append(("--use_peft true", lambda j: _replace(j, {"use_peft": True})))
    return out


def suggest_fixes(job: JobSpec, estimate: Callable, *, limit: int = 3) -> list[Fix]:
    """Up to `limit` single changes that fit; else the shortest cumulative chain of changes that fits."""
    applied: list[tuple[str, JobSpec]] = []
    fixes: list[Fix] = []
    for flags, change in _candidates(job):
        try:
            applied.append((flags, change(job)))
        except (HpcmemError, TypeError, ValueError):
            continue   # a change the spec refuses in this combination
        peak = estimate(applied[-1][1]).device_peak_bytes
        if peak <= job.gpu.memory_bytes:
            fixes.append(Fix(flags, peak))
            if len(fixes) == limit:
                break
    if fixes:
        return fixes
    chain: dict[str, str] = {}     # first flag → flags: a smaller batch supersedes the previous one
    cumulative = job
    for flags, change in _candidates(job):
        try:
            cumulative = change(cumulative)
        except (HpcmemError, TypeError, ValueError):
            continue
        chain[flags.split()[0]] = flags
        peak = estimate(cumulative).device_peak_bytes
        if peak <= job.gpu.memory_bytes:
            return [Fix(" ".join(chain.values()), peak)]
    return []

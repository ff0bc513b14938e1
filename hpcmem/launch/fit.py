"""Will the job fit? The estimate's verdict on the preset's GPU (hpcmem.estimate.verdict: the safe bound against the
capacity torch can use), and, when it is "tight" or "does not fit", the changes that would fit: the planner's plans
(hpcmem.plan), whose safe bounds fit, written as the flags to add.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from hpcmem.errors import HpcmemError
from hpcmem.estimate import estimate
from hpcmem.estimate.host import check_host
from hpcmem.estimate.verdict import judge
from hpcmem.plan import plan
from hpcmem.plan.flags import flags_line
from hpcmem.plan.resolution import largest_fitting_max_pixels

if TYPE_CHECKING:
    from hpcmem.estimate.host import HostCheck
    from hpcmem.estimate.verdict import FitVerdict
    from hpcmem.job.jobspec import JobSpec

GIB = 1024**3


@dataclass(frozen=True)
class Fix:
    flags: str              # what to add to the command line (shell-quoted)
    device_peak_bytes: int
    label: str = ""         # the plan's knobs in words (hpcmem plan's column)
    safe_device_peak_bytes: int = 0


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
    verdict: FitVerdict | None = None
    host: HostCheck | None = None       # host RAM per node vs the preset's memory_per_node_gb (None: not given)

    def message(self) -> str:
        head = (f"device peak {self.device_peak_bytes / GIB:.1f} GiB per GPU (allocated "
                f"{self.peak_allocated_bytes / GIB:.1f}, reserved {self.peak_reserved_bytes / GIB:.1f}) "
                f"vs {self.gpu_memory_bytes / GIB:.1f} GiB usable on {self.gpu_name}")
        first = self.verdict.line() if self.verdict else (
            "fits" if self.device_peak_bytes <= self.gpu_memory_bytes else "does not fit")
        lines = [first, head]
        if self.host is not None:
            host = self.host.message("(the preset's memory_per_node_gb)")
            lines = [*lines, host] if self.host.fits else [host, *lines]
        if self.fits:
            return "\n".join(lines)
        if self.fixes:
            lines.append("changes whose safe bound fits, best first (hpcmem plan):")
            lines += [f"  {f.flags}   → {f.device_peak_bytes / GIB:.1f} GiB, safe "
                      f"{f.safe_device_peak_bytes / GIB:.1f} GiB ({f.label})" for f in self.fixes]
        else:
            lines.append("no combination of memory techniques fits, even with LoRA: use a larger GPU, more GPUs or "
                         "nodes (more host RAM), a shorter max_length, or a smaller model")
        lines.append("(--force submits anyway)")
        return "\n".join(lines)


def _estimator() -> Callable:
    return estimate


def check_fit(job: JobSpec, *, estimator: Callable | None = None, max_fixes: int = 3,
              memory_per_node_bytes: int | None = None) -> FitReport:
    """Estimate `job` on its GPU (job.gpu must be set: submit takes it from the preset) and, when the preset says how
    much memory a node grants, its host RAM per node."""
    if job.gpu is None:
        raise HpcmemError("no GPU for the fit check: the preset's gpu must be in the catalog (hpcmem gpus)")

    estimate = estimator or _estimator()
    est = estimate(job)
    est_host = getattr(est, "host", None)        # an injected estimator (tests) may model no host RAM
    host = check_host(est_host, memory_per_node_bytes) if memory_per_node_bytes and est_host is not None else None
    # fits only when the safe bound fits: tight is refused
    verdict = judge(est.device_peak_bytes, job.gpu, getattr(est, "reserved_spread_bytes", 0), job.parallel.world_size,
                    getattr(est, "shapes_needed_bytes", 0))
    fits = verdict.fits and (host is None or host.fits)
    # fixes come from the real estimator's search; an injected estimator (tests) gets none
    fixes = () if fits or estimator is not None else tuple(suggest_fixes(job, limit=max_fixes,
                                                                          memory_per_node_bytes=memory_per_node_bytes))
    if estimator is None and not verdict.fits:         # the GPU's memory, not the host's: the images' resolution
        fixes += resolution_fix(job)
    return FitReport(fits=fits, device_peak_bytes=est.device_peak_bytes,
                     peak_allocated_bytes=est.peak_allocated_bytes, peak_reserved_bytes=est.peak_reserved_bytes,
                     gpu_name=job.gpu.name, gpu_memory_bytes=verdict.capacity_bytes,
                     estimate_json={**est.to_json(), "verdict": verdict.to_json()}, fixes=fixes, verdict=verdict,
                     host=host)


def suggest_fixes(job: JobSpec, *, limit: int = 3, memory_per_node_bytes: int | None = None) -> list[Fix]:
    """The `limit` best plans whose safe bound fits (and, given a node's memory, whose host RAM fits), in `hpcmem
    plan`'s order, as changes to the job's flags — its search (one search in the product), keeping the global batch.
    Changes that alter what is trained come last: packing is offered only when the job packs already, and LoRA only
    when nothing fits without it."""
    # a length profile's worst micro-batch (--lengths) holds for the batch and packing it was measured with: keep
    # them, as `hpcmem plan --lengths` does (hpcmem.plan.knobs.FIXING_FLAGS)
    fixed = {"lengths"} if job.tokens_per_micro_batch is not None else set()
    for allow_peft in (False, True):
        plans = plan(job, job.gpu, fixed=fixed, allow_peft=allow_peft, top=limit, exclude={"pack": ["packing"]},
                     host_memory_per_node_bytes=memory_per_node_bytes)
        if plans:
            return [Fix(flags_line(job, p.job), p.device_peak_bytes, p.knobs.label(), p.safe_device_peak_bytes)
                    for p in plans]
    return []


def resolution_fix(job: JobSpec) -> tuple[Fix, ...]:
    """The largest max_pixels at which the job as given fits (hpcmem.plan.resolution), as the last change offered: it
    changes what the model sees."""
    found = largest_fitting_max_pixels(job, estimate)
    if found is None:
        return ()
    return (Fix(f"--max_pixels {found.max_pixels}", found.device_peak_bytes,
                f"lower resolution: at most {found.image_tokens} image tokens per image; changes what is trained",
                found.safe_device_peak_bytes),)

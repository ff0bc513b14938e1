"""`hpcmem validate published`: each scored published row built as a job, estimated, and compared on the peak the
source measured; a summary per class (one GPU or several × peak kind), TRL's loop apart from the others ('raw').

Each row's error is reported raw (the estimate of TRL 1.16's step) and, where the source names how its loop takes the
loss, loop-adjusted (hpcmem.validate.published_loop: the full-logits loss sized from the loop's code in place of the
fused head); a row of another framework with no such term has no adjusted error. A miss beyond MISS_PCT (on the
adjusted error where there is one) carries the row's `cause` when the source names one, else it is listed as
unexplained."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from statistics import median

from hpcmem.errors import HpcmemError
from hpcmem.estimate import Estimate, estimate
from hpcmem.estimate.device import board_reserve_seen_by_nvml
from hpcmem.estimate.nccl import job_nvls_bytes
from hpcmem.estimate.verdict import judge
from hpcmem.gpus.lookup import gpu_spec
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.trl_config import accelerate_settings, build_job
from hpcmem.validate.published import PEAKS, Row
from hpcmem.validate.published_adapters import base_dtype_lora_estimate
from hpcmem.validate.published_loop import Adjusted, adjusted

MISS_PCT = 5.0
ADAPTERS_NOTE = "LoRA adapters, their gradients and AdamW states in the base dtype (peft <= 0.10, published_adapters); "
GIB = 2**30


@dataclass
class Scored:
    id: str
    source: str
    loop: str
    gpus: int
    gpu: str
    technique: str
    peak: str
    measured_gib: float | None              # None: an outcome row, judged on its verdict only
    estimated_gib: float | None
    error_pct: float | None
    verdict: str | None
    outcome: str
    fits_agrees: bool | None
    raw: bool
    cause: str = ""
    error: str = ""         # the row did not build or estimate: why
    adjusted_gib: float | None = None       # the loop-adjusted estimate (published_loop), None: no adjustment
    adjusted_error_pct: float | None = None
    adjust_note: str = ""
    spread_gib: float = 0.0                 # the estimate's reserved spread (its upper half is in the safe bound)
    margin_note: str = ""                   # where the verdict's margin came from
    contradicted: bool | None = None        # "does not fit" on a row that ran, or "fits" on one out of memory
    capacity_gib: float | None = None       # the GPU's usable capacity the verdict judged against

    @property
    def best_error_pct(self) -> float | None:
        """The loop-adjusted error where there is one, else the raw one."""
        return self.adjusted_error_pct if self.adjusted_error_pct is not None else self.error_pct

    @property
    def klass(self) -> str:
        return f"{'multi' if self.gpus > 1 else 'single'}-GPU {self.peak}"


def technique(row: Row) -> str:
    s = row.settings
    method = ("QLoRA" if s.get("load_in_4bit") else "DoRA" if s.get("use_dora") else "LoRA") if s.get("use_peft") \
        else "full"
    layout = str(s.get("accelerate_config") or "")
    offload = "+offload" if s.get("fsdp_offload_params") or s.get("offload_optimizer_device") == "cpu" else ""
    return f"{method} {layout}{offload}".strip()


def job_settings(row: Row) -> dict:
    """The row's settings as `hpcmem estimate` merges them: the accelerate config's fields first, then the others."""
    settings = dict(row.settings)
    accel = settings.pop("accelerate_config", None)
    return {**accelerate_settings(str(accel)), **settings} if accel else settings


def score(row: Row) -> Scored:
    base = dict(id=row.id, source=row.source, loop=row.loop_name, gpus=row.gpus, gpu=row.gpu,
                technique=technique(row), peak=row.peak,
                measured_gib=None if row.measured_bytes is None else round(row.measured_bytes / GIB, 3),
                outcome=row.outcome, raw=row.raw, cause=row.cause)
    try:
        job, _ = build_job(row.trainer, job_settings(row), gpu=gpu_spec(row.gpu))
        est = estimate(job)
    except HpcmemError as exc:
        return Scored(**base, estimated_gib=None, error_pct=None, verdict=None, fits_agrees=None,
                      error=" ".join(str(exc).split()))
    # a whole-GPU reading also shows what the driver reserves on the board (hpcmem.estimate.device); an outcome row
    # has no reading: its estimate is held against torch's capacity as the verdict holds it
    seen = board_reserve_seen_by_nvml(est.gpu) if row.peak == "device" and row.measured_bytes is not None else 0
    got = getattr(est, PEAKS[row.peak]) + seen
    # the source's step: its peft's adapter dtype where it differs from TRL 1.16's (published_adapters)
    loop_est = base_dtype_lora_estimate(job) if row.loss and row.adapters else est
    adj = adjusted(job, loop_est, row.loss, row.keeps_output, row.reserved_at_reset_bytes) if row.loss else None
    adj = with_run_nccl(job, est, adj, row.nccl)
    verdict = est.verdict
    if adj is not None and est.gpu is not None:     # judged on what the source's loop holds, not TRL's step
        verdict = judge(adj.device, est.gpu, est.reserved_spread_bytes, world_size=est.world_size,
                        shapes_bytes=est.shapes_needed_bytes)
    level = verdict.level if verdict is not None else None
    agrees = None if verdict is None else verdict.fits == (row.outcome == "ran")
    adj_bytes = adj.peak(row.peak) + seen if adj else (got if not row.raw else None)
    measured = row.measured_bytes
    return Scored(**base, estimated_gib=round(got / GIB, 3), error_pct=_pct(got, measured), verdict=level,
                  fits_agrees=agrees, adjusted_gib=None if adj_bytes is None else round(adj_bytes / GIB, 3),
                  adjusted_error_pct=None if adj_bytes is None else _pct(adj_bytes, measured),
                  adjust_note=(ADAPTERS_NOTE if row.adapters else "") + adj.note if adj else "",
                  spread_gib=round(est.reserved_spread_bytes / GIB, 3),
                  margin_note=verdict.calibration.note if verdict is not None else "",
                  capacity_gib=None if verdict is None else round(verdict.capacity_bytes / GIB, 3),
                  contradicted=None if verdict is None else (
                      level == "does not fit" if row.outcome == "ran" else verdict.fits))


def with_run_nccl(job: JobSpec, est: Estimate, adj: Adjusted | None, nccl: tuple[int, int] | None) -> Adjusted | None:
    """The adjusted estimate with the NVLS buffers of the run's NCCL in place of torch 2.13's (hpcmem.estimate.nccl):
    a device term, outside the allocator; unchanged when the source names no NCCL or the two are the same size."""
    if nccl is None:
        return adj
    run, modelled = job_nvls_bytes(job, nccl), job_nvls_bytes(job)
    if run == modelled:
        return adj
    base = adj or Adjusted(allocated=est.peak_allocated_bytes, reserved=est.peak_reserved_bytes,
                           device=est.device_peak_bytes, note="")
    note = (f"NCCL {nccl[0]}.{nccl[1]}'s NVLS buffers, {run / GIB:.2f} GiB a GPU, in place of torch 2.13's NCCL's "
            f"{modelled / GIB:.2f} GiB")
    return replace(base, device=base.device + run - modelled, note="; ".join(n for n in (base.note, note) if n))


def _pct(got: float, measured: float | None) -> float | None:
    return None if measured is None else round(100.0 * (got - measured) / measured, 2)


def _stats(errors: list[float]) -> dict:
    """n, median |error| % and the worst (largest |error|, signed) of a list of errors; empty → n 0."""
    if not errors:
        return {"n": 0, "median_abs_error_pct": None, "worst_error_pct": None}
    return {"n": len(errors), "median_abs_error_pct": round(median(abs(e) for e in errors), 2),
            "worst_error_pct": max(errors, key=abs)}


def summary(points: list[Scored]) -> list[dict]:
    """Per class (single/multi GPU × peak) and loop kind (TRL / raw): raw and loop-adjusted n, median |error| %, worst
    error % (signed), and how often `fits` agrees with the outcome."""
    groups: dict[tuple[str, str], list[Scored]] = {}
    for p in points:
        if p.error_pct is not None:
            groups.setdefault((p.klass, "raw" if p.raw else "trl"), []).append(p)
    out = []
    for (klass, loop), pts in sorted(groups.items()):
        raw = _stats([p.error_pct for p in pts])
        adj = _stats([p.adjusted_error_pct for p in pts if p.adjusted_error_pct is not None])
        worst = max(pts, key=lambda p: abs(p.error_pct))
        out.append({"class": klass, "loop": loop, **raw, "worst_row": worst.id,
                    "adjusted": adj, "fits_agrees": sum(1 for p in pts if p.fits_agrees),
                    "fits_judged": sum(1 for p in pts if p.fits_agrees is not None),
                    "contradicted": sum(1 for p in pts if p.contradicted)})
    return out


def outcomes(points: list[Scored]) -> dict:
    """The verdict against what each source reports, over every row with a verdict (outcome rows included): judged,
    "fits" where the job ran, and contradicted ("does not fit" on a row that ran, "fits" on one out of memory)."""
    judged = [p for p in points if p.verdict is not None]
    return {"judged": len(judged), "ran": sum(p.outcome == "ran" for p in judged),
            "oom": sum(p.outcome == "oom" for p in judged), "outcome_only": sum(p.measured_gib is None for p in judged),
            "levels": {lvl: sum(p.verdict == lvl for p in judged) for lvl in sorted({p.verdict for p in judged})},
            "contradicted": [p.id for p in judged if p.contradicted]}


def trl_or_adjusted(points: list[Scored]) -> dict:
    """Over rows whose loop is TRL's or adjusted to it: n, median |error| %, worst (adjusted errors)."""
    return _stats([p.adjusted_error_pct for p in points if p.adjusted_error_pct is not None])


def misses(points: list[Scored]) -> tuple[list[Scored], list[Scored]]:
    """Rows beyond MISS_PCT on their best error (adjusted where there is one): (with a cause the source or the
    loop adjustment names, unexplained)."""
    beyond = [p for p in points if p.best_error_pct is not None and abs(p.best_error_pct) > MISS_PCT]
    return [p for p in beyond if p.cause], [p for p in beyond if not p.cause]


def to_json(points: list[Scored], unscored: list[Row], files: list[str], margin: dict | None = None,
            single: dict | None = None) -> dict:
    explained, unexplained = misses(points)
    return {"files": files, "rows": [asdict(p) | {"class": p.klass} for p in points], "summary": summary(points),
            "trl_or_adjusted": trl_or_adjusted(points), "outcomes": outcomes(points), "multi_gpu_margin": margin, "single_gpu_margin": single,
            "explained_misses": [p.id for p in explained], "unexplained_misses": [p.id for p in unexplained],
            "unscored": [{"id": r.id, "source": r.source, "reason": r.reason} for r in unscored]}


def _err(value: float | None, width: int = 8) -> str:
    return f"{value:+{width - 1}.1f}%" if value is not None else f"{'-':>{width}}"


def render(points: list[Scored], unscored: list[Row]) -> str:
    head = (f"{'row':<40} {'source':<22} {'GPUs':>4} {'technique':<22} {'peak':<9} {'measured':>9} "
            f"{'estimated':>9} {'raw':>8} {'adjusted':>8}  fits/outcome")
    lines = [head, "-" * len(head)]
    for trl in (True, False):
        part = [p for p in points if p.raw != trl]
        if not part:
            continue
        lines.append("TRL's loop" if trl else "other loops (raw error: the estimate models TRL 1.16's trainers)")
        for p in part:
            est = f"{p.estimated_gib:9.2f}" if p.estimated_gib is not None else f"{'-':>9}"
            measured = f"{p.measured_gib:9.2f}" if p.measured_gib is not None else f"{p.outcome:>9}"
            # ok: "fits" on a row that ran or "does not fit" on one out of memory; CONTRADICTED: the opposite;
            # cautious: "tight" (the safe bound passes the capacity) on a row that ran — not a contradiction
            agree = "-" if p.fits_agrees is None else f"{p.verdict}/{p.outcome} " + (
                "ok" if p.fits_agrees else "CONTRADICTED" if p.contradicted else "cautious")
            if p.measured_gib is None and p.adjusted_gib is not None and p.capacity_gib:
                agree += f" (adjusted {p.adjusted_gib:.1f} GiB = {100 * p.adjusted_gib / p.capacity_gib:.0f} % of " \
                         f"{p.capacity_gib:.1f} usable)"
            lines.append(f"{p.id:<40} {p.source:<22} {p.gpus:>4} {p.technique:<22} {p.peak:<9} "
                         f"{measured} {est} {_err(p.error_pct)} {_err(p.adjusted_error_pct)}  {agree}")
            if p.error:
                lines.append(f"    not estimated: {p.error}")
        lines.append("    loops: " + "; ".join(sorted({f'{p.source}: {p.loop}' for p in part})))
    lines.append("adjusted: " + "; ".join(sorted({p.adjust_note.split(":")[0] for p in points if p.adjust_note})))
    lines.append("\nsummary (GiB; error = (estimated - measured) / measured; raw | loop-adjusted)")
    for s in summary(points):
        a = s["adjusted"]
        adj = (f"n={a['n']:<3} median {a['median_abs_error_pct']:6.2f} %  worst {a['worst_error_pct']:+7.2f} %"
               if a["n"] else "not adjusted (another framework)")
        lines.append(f"  {s['class']:<22} {s['loop']:<4} raw n={s['n']:<3} median |err| "
                     f"{s['median_abs_error_pct']:6.2f} %  worst {s['worst_error_pct']:+7.2f} % | adjusted {adj}  fits agrees "
                     f"{s['fits_agrees']}/{s['fits_judged']}, contradicted {s['contradicted']}")
    t = trl_or_adjusted(points)
    if t["n"]:
        lines.append(f"  rows whose loop is TRL's or adjusted to it: n={t['n']} median |err| "
                     f"{t['median_abs_error_pct']:.2f} %  worst {t['worst_error_pct']:+.2f} %")
    o = outcomes(points)
    lines.append(f"  verdict against outcome: {o['judged']} rows judged ({o['ran']} ran, {o['oom']} out of memory; "
                 f"{o['outcome_only']} outcome rows without a measured peak): "
                 + ", ".join(f"{n} {lvl}" for lvl, n in o["levels"].items())
                 + f"; contradicted {len(o['contradicted'])}" + (f" ({', '.join(o['contradicted'])})"
                                                                 if o["contradicted"] else ""))
    explained, unexplained = misses(points)
    for p in explained:
        lines.append(f"miss {p.id} ({_err(p.best_error_pct, 1).strip()}): {p.cause}")
    if unexplained:
        lines.append(f"unexplained misses beyond {MISS_PCT:g} %: " + ", ".join(
            f"{p.id} ({p.best_error_pct:+.1f} %)" for p in unexplained))
    for r in unscored:
        lines.append(f"unscored {r.id} ({r.source}): {r.reason}")
    return "\n".join(lines)

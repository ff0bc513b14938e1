"""`hpcmem validate published`: each scored published row built as a job, estimated, and compared on the peak the
source measured; a summary per class (one GPU or several × peak kind), TRL's loop apart from the others ('raw').

No adjustment is made for a loop that is not TRL's: its error is reported as it is, with the loop named. A miss beyond
MISS_PCT carries the row's `cause` when the source names one, else it is listed as unexplained."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from statistics import median

from hpcmem.errors import HpcmemError
from hpcmem.estimate import estimate
from hpcmem.gpus.lookup import gpu_spec
from hpcmem.job.trl_config import accelerate_settings, build_job
from hpcmem.validate.published import PEAKS, Row

MISS_PCT = 5.0
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
    measured_gib: float
    estimated_gib: float | None
    error_pct: float | None
    verdict: str | None
    outcome: str
    fits_agrees: bool | None
    raw: bool
    cause: str = ""
    error: str = ""         # the row did not build or estimate: why

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
                technique=technique(row), peak=row.peak, measured_gib=round(row.measured_bytes / GIB, 3),
                outcome=row.outcome, raw=row.raw, cause=row.cause)
    try:
        job, _ = build_job(row.trainer, job_settings(row), gpu=gpu_spec(row.gpu))
        est = estimate(job)
    except HpcmemError as exc:
        return Scored(**base, estimated_gib=None, error_pct=None, verdict=None, fits_agrees=None,
                      error=" ".join(str(exc).split()))
    got = getattr(est, PEAKS[row.peak])
    verdict = est.verdict
    level = verdict.level if verdict is not None else None
    agrees = None if verdict is None else verdict.fits == (row.outcome == "ran")
    return Scored(**base, estimated_gib=round(got / GIB, 3),
                  error_pct=round(100.0 * (got - row.measured_bytes) / row.measured_bytes, 2), verdict=level,
                  fits_agrees=agrees)


def summary(points: list[Scored]) -> list[dict]:
    """Per class (single/multi GPU × peak) and loop kind (TRL / raw): n, median |error| %, worst error % (signed)."""
    groups: dict[tuple[str, str], list[Scored]] = {}
    for p in points:
        if p.error_pct is not None:
            groups.setdefault((p.klass, "raw" if p.raw else "trl"), []).append(p)
    out = []
    for (klass, loop), pts in sorted(groups.items()):
        worst = max(pts, key=lambda p: abs(p.error_pct))
        out.append({"class": klass, "loop": loop, "n": len(pts),
                    "median_abs_error_pct": round(median(abs(p.error_pct) for p in pts), 2),
                    "worst_error_pct": worst.error_pct, "worst_row": worst.id,
                    "fits_agrees": sum(1 for p in pts if p.fits_agrees), "fits_judged": sum(
                        1 for p in pts if p.fits_agrees is not None)})
    return out


def misses(points: list[Scored]) -> tuple[list[Scored], list[Scored]]:
    """Rows beyond MISS_PCT: (explained by a cause the source names, unexplained)."""
    beyond = [p for p in points if p.error_pct is not None and abs(p.error_pct) > MISS_PCT]
    return [p for p in beyond if p.cause], [p for p in beyond if not p.cause]


def to_json(points: list[Scored], unscored: list[Row], files: list[str]) -> dict:
    explained, unexplained = misses(points)
    return {"files": files, "rows": [asdict(p) | {"class": p.klass} for p in points], "summary": summary(points),
            "explained_misses": [p.id for p in explained], "unexplained_misses": [p.id for p in unexplained],
            "unscored": [{"id": r.id, "source": r.source, "reason": r.reason} for r in unscored]}


def render(points: list[Scored], unscored: list[Row]) -> str:
    head = (f"{'row':<40} {'source':<22} {'GPUs':>4} {'technique':<22} {'peak':<9} {'measured':>9} "
            f"{'estimated':>9} {'error':>8}  fits/outcome")
    lines = [head, "-" * len(head)]
    for trl in (True, False):
        part = [p for p in points if p.raw != trl]
        if not part:
            continue
        lines.append("TRL's loop" if trl else "other loops (raw error: the estimate models TRL's trainers)")
        for p in part:
            est = f"{p.estimated_gib:9.2f}" if p.estimated_gib is not None else f"{'-':>9}"
            err = f"{p.error_pct:+7.1f}%" if p.error_pct is not None else f"{'-':>8}"
            agree = "-" if p.fits_agrees is None else f"{p.verdict}/{p.outcome} {'ok' if p.fits_agrees else 'DISAGREE'}"
            lines.append(f"{p.id:<40} {p.source:<22} {p.gpus:>4} {p.technique:<22} {p.peak:<9} "
                         f"{p.measured_gib:9.2f} {est} {err}  {agree}")
            if p.error:
                lines.append(f"    not estimated: {p.error}")
        if not trl:
            lines.append("    loops: " + "; ".join(sorted({f'{p.source}: {p.loop}' for p in part})))
    lines.append("\nsummary (GiB; error = (estimated - measured) / measured)")
    for s in summary(points):
        lines.append(f"  {s['class']:<22} {s['loop']:<4} n={s['n']:<3} median |err| {s['median_abs_error_pct']:6.2f} %"
                     f"  worst {s['worst_error_pct']:+7.2f} % ({s['worst_row']})  fits agrees "
                     f"{s['fits_agrees']}/{s['fits_judged']}")
    explained, unexplained = misses(points)
    for p in explained:
        lines.append(f"miss {p.id} ({p.error_pct:+.1f} %): {p.cause}")
    if unexplained:
        lines.append(f"unexplained misses beyond {MISS_PCT:g} %: " + ", ".join(
            f"{p.id} ({p.error_pct:+.1f} %)" for p in unexplained))
    for r in unscored:
        lines.append(f"unscored {r.id} ({r.source}): {r.reason}")
    return "\n".join(lines)

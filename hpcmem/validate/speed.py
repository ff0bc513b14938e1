"""Speed, measured: the planner's throughput model held to timed probe runs, and its MFU curve fitted per GPU from
them (`hpcmem validate probes --speed [--fit]`; stdlib + the planner).

Measured tokens/s per GPU: a record's tokens over its timed steps (every optimizer step after step 0,
hpcmem.record.Measured). Records made before steps were timed (schema 1, the H200 records of 2026-11-29) keep only
`train_s`, the wall time of all their steps, step 0 included (cuBLAS and allocator initialisation, optimizer states
created): their rate is the tokens the probe fed (the estimator's micro-batch, which the probe's batch reproduces)
over train_s — a lower bound on the steady rate, labelled `train_s`, never used to fit.

Predicted tokens/s: the run's tokens per step over the model's step time for the run's job on its GPU
(hpcmem.plan.speed), so the comparison tests the time model and its constants, not the padding fill the planner
assumes for data it has not seen. Rank agreement: Kendall's tau-b of predicted against measured over the runs
(Kendall 1945, "The treatment of ties in ranking problems"): 1 when the planner orders them as they ran.

Left out: GRPO/RLOO (the model has no generation time), CPU runs, and runs with neither timed steps nor train_s.

The fit (records with timed steps on a GPU; one process, no offload, no QLoRA: the runs whose modelled step is
compute alone): each run's achieved MFU = model FLOPs of a step / (its mean step time × the GPU's bf16 peak); the
curve MFU(t) = m · t / (t + h) over the tokens t of one micro-batch is fitted by least squares (h on a log grid,
m in closed form for each h). Fewer than MIN_FIT runs or fewer than two distinct t: no fit, the default stays.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from dataclasses import dataclass
from typing import Any

from hpcmem.job.shape import micro_batch
from hpcmem.plan.speed import job_throughput
from hpcmem.record import Record
from hpcmem.validate.probes import record_job

MIN_FIT = 3
NOT_MODELLED = ("grpo", "rloo")
HALF_GRID = tuple(16 * 2 ** (i / 8) for i in range(8 * 13))      # 16 … ~131k tokens, 8 steps per doubling


@dataclass(frozen=True, kw_only=True)
class SpeedRow:
    case: str
    record_id: str
    trainer: str
    technique: str
    gpu: str
    tokens_per_step: int
    measured_tokens_per_s: float
    predicted_tokens_per_s: float
    source: str                       # "steps" (timed steps after step 0) or "train_s" (all steps, step 0 included)
    mfu_achieved: float | None        # model FLOPs / (step time × peak), runs the fit may use
    micro_tokens: int                 # tokens of one micro-batch (the MFU curve's t)

    @property
    def ratio(self) -> float:
        return self.predicted_tokens_per_s / self.measured_tokens_per_s


def measured(rec: Record, job: Any) -> tuple[int, float, str] | None:
    """(tokens per step, tokens/s, source) of a run, or None when it was not timed."""
    m = rec.measured
    if m.step_times_s and m.tokens_per_step and m.tokens_per_s:
        return round(sum(m.tokens_per_step) / len(m.tokens_per_step)), m.tokens_per_s, "steps"
    train_s, steps = m.extra.get("timings", {}).get("train_s"), rec.run.steps
    if rec.status != "ok" or not train_s or not steps:
        return None

    mb = micro_batch(job)
    per_step = mb.rows * mb.seq * job.train.gradient_accumulation_steps
    return per_step, per_step * steps / float(train_s), "train_s"


def row_of(rec: Record, job: Any, slug: str) -> SpeedRow | None:
    trainer, technique = rec.cell
    if trainer in NOT_MODELLED or job.gpu is None or rec.status != "ok" or rec.device == "cpu" or rec.shared_gpu:
        return None             # the throughput model is a GPU's, alone: a CPU rehearsal's or a shared run's speed
    got = measured(rec, job)
    if got is None:
        return None

    per_step, rate, source = got
    speed = job_throughput(job, job.gpu)
    mb = micro_batch(job)
    peak = job.gpu.peak_tflops(job.train.fp16)
    fit_ok = (source == "steps" and rec.device == "cuda" and job.parallel.world_size == 1 and peak
              and speed.comm_s == 0 and speed.offload_s == 0 and not job.train.quantized)
    step_s = per_step / rate
    return SpeedRow(case=str(rec.case or rec.id[:8]), record_id=rec.id, trainer=trainer, technique=technique,
                    gpu=slug, tokens_per_step=per_step, measured_tokens_per_s=rate,
                    predicted_tokens_per_s=per_step / speed.step_s, source=source,
                    mfu_achieved=speed.flops / (step_s * peak * 1e12) if fit_ok else None,
                    micro_tokens=mb.rows * mb.seq)


def kendall_tau(xs: list[float], ys: list[float]) -> float | None:
    """Kendall's tau-b (ties in either ranking adjusted); None for fewer than two pairs or a constant ranking."""
    n = len(xs)
    concordant = discordant = ties_x = ties_y = 0
    for i in range(n):
        for j in range(i + 1, n):
            dx, dy = xs[i] - xs[j], ys[i] - ys[j]
            if dx == 0 and dy == 0:
                continue
            if dx == 0:
                ties_x += 1
            elif dy == 0:
                ties_y += 1
            elif (dx > 0) == (dy > 0):
                concordant += 1
            else:
                discordant += 1
    denom = math.sqrt((concordant + discordant + ties_x) * (concordant + discordant + ties_y))
    return None if n < 2 or denom == 0 else (concordant - discordant) / denom


def fit_mfu(rows: list[SpeedRow]) -> dict[str, Any] | None:
    """The MFU curve of the runs that may fit it (module docstring), or None with too few."""
    pts = [(float(r.micro_tokens), r.mfu_achieved) for r in rows if r.mfu_achieved is not None]
    if len(pts) < MIN_FIT or len({t for t, _ in pts}) < 2:
        return None
    best = None
    for half in HALF_GRID:
        f = [t / (t + half) for t, _ in pts]
        m = sum(fi * y for fi, (_, y) in zip(f, pts)) / sum(fi * fi for fi in f)
        sse = sum((y - m * fi) ** 2 for fi, (_, y) in zip(f, pts))
        if best is None or sse < best[0]:
            best = (sse, m, half)
    sse, m, half = best
    return {"mfu_max": round(m, 6), "mfu_half_tokens": round(half, 1), "n": len(pts),
            "rmse": round(math.sqrt(sse / len(pts)), 6), "records": sorted(r.record_id for r in rows
                                                                          if r.mfu_achieved is not None),
            "fitted_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "model": "MFU(t) = mfu_max · t / (t + mfu_half_tokens), t = tokens of one micro-batch "
                     "(hpcmem.plan.throughput)"}


def held_out_ratios(rows: list[SpeedRow]) -> list[tuple[str, float, float]]:
    """(case, in-sample ratio, leave-one-out ratio) of predicted/measured tokens/s for each run the fit may use, with
    the curve fitted on all runs and on all runs but that one. On these runs the modelled step is compute alone, so
    the predicted rate is proportional to the curve's MFU and the ratio is MFU_fit(t) / MFU_achieved."""
    usable = [r for r in rows if r.mfu_achieved]
    full = fit_mfu(usable)
    out = []
    for i, r in enumerate(usable):
        loo = fit_mfu(usable[:i] + usable[i + 1:])
        if full is None or loo is None:
            continue
        out.append((r.case, _curve(full, r.micro_tokens) / r.mfu_achieved,
                    _curve(loo, r.micro_tokens) / r.mfu_achieved))
    return out


def _curve(fit: dict[str, Any], tokens: float) -> float:
    return fit["mfu_max"] * tokens / (tokens + fit["mfu_half_tokens"])


def summary(rows: list[SpeedRow]) -> dict[str, Any]:
    by_gpu: dict[str, list[SpeedRow]] = {}
    for r in rows:
        by_gpu.setdefault(r.gpu, []).append(r)
    out = {}
    for gpu, rs in sorted(by_gpu.items()):
        ratios = sorted(r.ratio for r in rs)
        out[gpu] = {"n": len(rs), "timed_steps": sum(r.source == "steps" for r in rs),
                    "kendall_tau": kendall_tau([r.predicted_tokens_per_s for r in rs],
                                               [r.measured_tokens_per_s for r in rs]),
                    "median_ratio": ratios[len(ratios) // 2] if ratios else None,
                    "min_ratio": ratios[0] if ratios else None, "max_ratio": ratios[-1] if ratios else None}
    return out


def render(rows: list[SpeedRow]) -> str:
    head = (f"{'gpu':<12} {'case':<30} {'cell':<22} {'tok/step':>9} {'measured':>10} {'predicted':>10} "
            f"{'pred/meas':>9}  source")
    lines = [head, "-" * len(head)]
    for r in sorted(rows, key=lambda r: (r.gpu, -r.measured_tokens_per_s)):
        lines.append(f"{r.gpu:<12} {r.case[:30]:<30} {(r.trainer + ' ' + r.technique)[:22]:<22} "
                     f"{r.tokens_per_step:>9,} {r.measured_tokens_per_s:>10,.0f} {r.predicted_tokens_per_s:>10,.0f} "
                     f"{r.ratio:>9.2f}  {r.source}")
    for gpu, s in summary(rows).items():
        tau = "-" if s["kendall_tau"] is None else f"{s['kendall_tau']:.3f}"
        lines.append(f"{gpu}: n = {s['n']} ({s['timed_steps']} with timed steps) · Kendall's tau (planner order vs "
                     f"measured) {tau} · predicted/measured median {s['median_ratio']:.2f}, range "
                     f"{s['min_ratio']:.2f}–{s['max_ratio']:.2f}")
    return "\n".join(lines)


def rows_for(loaded: Any) -> list[SpeedRow]:
    """Speed rows of every record `hpcmem.validate.probes.load` read (the job as it ran, on its GPU)."""
    out = []
    for slug, recs in sorted(loaded.by_gpu.items()):
        for rec in recs:
            try:
                job = record_job(rec)
            except Exception:  # noqa: BLE001 - a record whose spec no longer builds has no prediction (said below)
                continue
            row = row_of(rec, job, slug)
            if row is not None:
                out.append(row)
    return out


def to_json(rows: list[SpeedRow]) -> dict[str, Any]:
    return {"rows": [{**dataclasses.asdict(r), "ratio": round(r.ratio, 4)} for r in rows], "summary": summary(rows)}

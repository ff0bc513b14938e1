"""`hpcmem validate published --speed`: each scored published speed row built as a job (as the memory rows are,
hpcmem.validate.published_score.job_settings) and given the planner's throughput (hpcmem.plan.speed, the same code,
constants and MFU curve the planner ranks with); predicted vs measured tokens/s per GPU.

Predicted tokens/s counts the tokens the step computes (rows × max_length, packed or not, over the model's step
time), as the validation against probe runs does (hpcmem.validate.speed): every source here measures tokens that are
real and computed alike (fixed-length rows, packed rows, or max_length set to the mean row), so the planner's padding
fill for unseen data is not under test.

Scores:
- ratio = predicted / measured; the ratio error is the factor between them, max(ratio, 1/ratio) ≥ 1.
- Kendall's tau-b of predicted against measured (hpcmem.validate.speed.kendall_tau) over all rows and within each
  source: within one source the loop, software and counting are the same, and the ranking there is what the planner
  needs.
- The pair ratio error: for two rows, the factor between the predicted and the measured ratio of their speeds —
  what the planner's comparison of two plans is worth (a single scale cancels in it). Its median within a source is
  set beside THROUGHPUT_UNCERTAINTY, the band inside which the planner calls two plans equal.
- Leave one source out: the model's absolute level (MFU_MAX and the other efficiencies, uncalibrated) is the one
  thing a published table can set. For each source a single scale on tokens/s is fitted on the OTHER sources (the
  geometric mean of measured / predicted) and applied to this source's rows; only these held-out ratios are
  reported. The scale fitted on every source (`all_sources_scale`) is reported with the rows it came from, and is
  not applied to the planner.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from statistics import median
from typing import Any

from hpcmem.errors import HpcmemError
from hpcmem.gpus.lookup import gpu_spec
from hpcmem.job.shape import micro_batch
from hpcmem.job.trl_config import accelerate_settings, build_job
from hpcmem.plan.speed import job_throughput
from hpcmem.validate.published_speed import SpeedRow
from hpcmem.validate.speed import kendall_tau


@dataclass
class ScoredSpeed:
    id: str
    source: str
    gpu: str
    gpus: int
    technique: str
    measured: float                   # tokens/s per GPU
    predicted: float | None
    unmodelled: tuple[str, ...] = ()
    held_out_predicted: float | None = None     # predicted × the scale fitted on the other sources
    error: str = ""

    @property
    def ratio(self) -> float | None:
        return None if self.predicted is None else self.predicted / self.measured

    @property
    def held_out_ratio(self) -> float | None:
        return None if self.held_out_predicted is None else self.held_out_predicted / self.measured


def ratio_error(ratio: float) -> float:
    """The factor between prediction and measurement: 1.25 for 25 % over or 20 % under."""
    return max(ratio, 1.0 / ratio)


def technique(s: dict[str, Any]) -> str:
    method = ("QLoRA" if s.get("load_in_4bit") else "DoRA" if s.get("use_dora") else "LoRA") \
        if s.get("use_peft") else "full"
    parts = [method, str(s.get("accelerate_config") or "")]
    parts += [flag for key, flag in (("gradient_checkpointing", "GC"), ("fsdp_offload_params", "offload"),
                                     ("activation_offloading", "act-offload"), ("torch_compile", "compile"))
              if s.get(key)]
    return " ".join(p for p in parts if p)


def job_settings(row: SpeedRow) -> dict:
    """The row's settings as `hpcmem estimate` merges them: the accelerate config's fields first, then the others."""
    settings = dict(row.settings)
    accel = settings.pop("accelerate_config", None)
    return {**accelerate_settings(str(accel)), **settings} if accel else settings


def predict(row: SpeedRow) -> float:
    """Tokens/s per GPU the planner's throughput model gives the row's job: computed tokens of a step / step time."""
    gpu = gpu_spec(row.gpu)
    job, _ = build_job(row.trainer, job_settings(row), gpu=gpu)
    mb = micro_batch(job)
    return mb.tokens * job.train.gradient_accumulation_steps / job_throughput(job, gpu).step_s


def score(row: SpeedRow) -> ScoredSpeed:
    base = dict(id=row.id, source=row.source, gpu=row.gpu.split(",")[0].removeprefix("name="), gpus=row.gpus,
                technique=technique(row.settings), measured=round(row.tokens_per_s, 1), unmodelled=row.unmodelled)
    try:
        return ScoredSpeed(**base, predicted=round(predict(row), 1))
    except HpcmemError as exc:
        return ScoredSpeed(**base, predicted=None, error=" ".join(str(exc).split()))


def fitted_scale(points: list[ScoredSpeed]) -> float | None:
    """The scale s minimising Σ (log(s·predicted) − log measured)²: the geometric mean of measured / predicted."""
    logs = [math.log(p.measured / p.predicted) for p in points if p.predicted]
    return math.exp(sum(logs) / len(logs)) if logs else None


def hold_out(points: list[ScoredSpeed]) -> dict[str, float | None]:
    """Leave one source out: each source's rows get the scale fitted on the other sources; {source: scale}."""
    scales = {}
    for src in sorted({p.source for p in points}):
        scale = scales[src] = fitted_scale([p for p in points if p.source != src])
        for p in points:
            if p.source == src and p.predicted is not None and scale is not None:
                p.held_out_predicted = p.predicted * scale
    return scales


def stats(points: list[ScoredSpeed], held_out: bool = False) -> dict[str, Any]:
    """n, Kendall's tau, median and worst ratio error, geometric-mean ratio (bias) of the rows with a prediction."""
    pts = [p for p in points if (p.held_out_ratio if held_out else p.ratio) is not None]
    if not pts:
        return {"n": 0}
    ratios = [p.held_out_ratio if held_out else p.ratio for p in pts]
    errors = [ratio_error(r) for r in ratios]
    worst = max(range(len(pts)), key=lambda i: errors[i])
    tau = kendall_tau([p.predicted for p in pts], [p.measured for p in pts])
    pairs = [ratio_error(a / b) for i, a in enumerate(ratios) for b in ratios[i + 1:]]
    return {"n": len(pts), "kendall_tau": None if tau is None else round(tau, 3),
            "median_ratio_error": round(median(errors), 3), "worst_ratio_error": round(errors[worst], 3),
            "median_pair_ratio_error": round(median(pairs), 3) if pairs else None,
            "worst_row": pts[worst].id, "geomean_ratio": round(math.exp(sum(map(math.log, ratios)) / len(ratios)), 3)}


def summary(points: list[ScoredSpeed]) -> dict[str, Any]:
    """Overall, per source and over the rows with nothing unmodelled; raw and held out (leave one source out)."""
    scales = hold_out(points)
    sources = sorted({p.source for p in points})
    clean = [p for p in points if not p.unmodelled]
    return {"overall": stats(points), "overall_held_out": stats(points, held_out=True),
            "nothing_unmodelled": stats(clean),
            "per_source": {s: stats([p for p in points if p.source == s]) for s in sources},
            "per_source_held_out": {s: stats([p for p in points if p.source == s], held_out=True) for s in sources},
            "held_out_scales": {s: None if v is None else round(v, 3) for s, v in scales.items()},
            "all_sources_scale": _round(fitted_scale(points)),
            "all_sources_scale_rows": sum(1 for p in points if p.predicted)}


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def to_json(points: list[ScoredSpeed], unscored: list[SpeedRow], files: list[str]) -> dict[str, Any]:
    out = summary(points)
    rows = [asdict(p) | {"held_out_predicted": _round(p.held_out_predicted), "ratio": _round(p.ratio),
                         "held_out_ratio": _round(p.held_out_ratio)} for p in points]
    return {"files": files, "rows": rows, "summary": out,
            "unscored": [{"id": r.id, "source": r.source, "reason": r.reason} for r in unscored]}


def render(points: list[ScoredSpeed], unscored: list[SpeedRow], rows: list[SpeedRow]) -> str:
    s = summary(points)
    head = (f"{'row':<42} {'GPU':<13} {'n':>2} {'technique':<30} {'measured':>9} {'predicted':>9} {'ratio':>6} "
            f"{'held-out':>8}")
    lines = [head, "-" * len(head)]
    for src in sorted({p.source for p in points}):
        lines.append(f"{src}: {next(r.citation for r in rows if r.source == src)} "
                     f"({next(r.loop_name for r in rows if r.source == src)})")
        for p in (p for p in points if p.source == src):
            pred = f"{p.predicted:9,.0f}" if p.predicted is not None else f"{'-':>9}"
            ratio = f"{p.ratio:6.2f}" if p.ratio is not None else f"{'-':>6}"
            held = f"{p.held_out_ratio:8.2f}" if p.held_out_ratio is not None else f"{'-':>8}"
            lines.append(f"{p.id[:42]:<42} {p.gpu[:13]:<13} {p.gpus:>2} {p.technique[:30]:<30} {p.measured:9,.0f} "
                         f"{pred} {ratio} {held}" + (f"  [{'; '.join(p.unmodelled)}]" if p.unmodelled else ""))
            if p.error:
                lines.append(f"    not predicted: {p.error}")
    lines.append("\ntokens/s per GPU; ratio = predicted / measured; ratio error = max(ratio, 1/ratio); held-out = "
                 "ratio after a scale fitted on the other sources; [..] = what the row runs that the model ignores; "
                 "pair = median ratio error of one row's speed relative to another's")
    lines.append(_line("all rows", s["overall"]))
    lines.append(_line("all rows, held out", s["overall_held_out"]))
    lines.append(_line("nothing unmodelled", s["nothing_unmodelled"]))
    for src in s["per_source"]:
        lines.append(_line(src, s["per_source"][src]))
        lines.append(_line(f"{src}, held out (scale {s['held_out_scales'][src]})", s["per_source_held_out"][src]))
    lines.append(f"scale fitted on all {s['all_sources_scale_rows']} rows: {s['all_sources_scale']} "
                 "(measured / predicted, geometric mean; reported, not applied to the planner)")
    for r in unscored:
        lines.append(f"unscored {r.id} ({r.source}): {r.reason}")
    return "\n".join(lines)


def _line(label: str, st: dict[str, Any]) -> str:
    if not st.get("n"):
        return f"  {label:<48} n=0"
    tau = "-" if st["kendall_tau"] is None else f"{st['kendall_tau']:+.3f}"
    return (f"  {label:<48} n={st['n']:<3} tau {tau}  ratio error median x{st['median_ratio_error']:.2f} worst "
            f"x{st['worst_ratio_error']:.2f} ({st['worst_row']})  geomean ratio {st['geomean_ratio']:.2f}"
            + (f"  pair x{st['median_pair_ratio_error']:.2f}" if st["median_pair_ratio_error"] else ""))

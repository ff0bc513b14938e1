"""Error statistics of estimates against measurements, per cell and per peak (stdlib; shared by every source).

A `Point` is one (predicted, measured) pair for one peak of one run. Errors are signed and relative to the
measurement: err % = 100 · (predicted − measured) / measured, so a negative error is an under-estimate. A run that ran
out of memory is censored: its need is only known to be ≥ the capacity; it counts for the safe bound (a bound below
the capacity is an under-estimate) and never for the error statistics.

The safe bound is (predicted + spread / 2) · (1 + margin) with a margin calibrated per peak
(hpcmem.validate.calibration; the spread: a block the caching allocator may or may not map again,
hpcmem.estimate.verdict); its under-estimate rate is the share of runs it does not cover and its slack the median
(bound − measured) / measured.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from hpcmem.estimate.verdict import upper

PEAKS = ("allocated", "reserved", "device")


@dataclass(frozen=True, kw_only=True)
class Point:
    gpu: str                      # GPU slug of the record file ("cpu" for CPU runs)
    trainer: str
    technique: str
    peak: str                     # allocated | reserved | device
    predicted: float
    measured: float               # for a censored point: the capacity it exceeded
    censored: bool = False
    record_id: str = ""
    spread: float = 0.0           # reserved / device: the estimate's reserved spread (0 for allocated)

    @property
    def err_pct(self) -> float:
        return 100.0 * (self.predicted - self.measured) / self.measured

    @property
    def upper(self) -> float:
        """What the safe bound widens: the upper outcome (hpcmem.estimate.verdict `upper`)."""
        return upper(self.predicted, self.spread)


@dataclass(frozen=True, kw_only=True)
class CellStats:
    gpu: str
    trainer: str
    technique: str
    peak: str
    n: int
    n_censored: int
    median_abs_err_pct: float | None
    p95_abs_err_pct: float | None
    max_abs_err_pct: float | None
    bias_pct: float | None            # mean signed error: > 0 over-estimates on average
    margin: float
    under_rate_pct: float | None      # share of runs (censored included) the safe bound does not cover
    median_slack_pct: float | None
    extra: dict = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str, str, str]:
        return self.gpu, self.trainer, self.technique, self.peak


def quantile(values: list[float], q: float) -> float:
    """Nearest-rank quantile (no interpolation: with few runs, report a run that happened)."""
    if not values:
        raise ValueError("quantile of no values")
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


def median(values: list[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def cell_stats(points: list[Point], margin: float) -> CellStats:
    first = points[0]
    exact = [p for p in points if not p.censored]
    errs = [p.err_pct for p in exact]
    abs_errs = [abs(e) for e in errs]
    bounds = [(p.upper * (1.0 + margin), p) for p in points]
    under = [b < p.measured for b, p in bounds]        # a censored need is ≥ its capacity: below it is under
    slack = [100.0 * (b - p.measured) / p.measured for b, p in bounds if not p.censored]
    return CellStats(
        gpu=first.gpu, trainer=first.trainer, technique=first.technique, peak=first.peak, n=len(exact),
        n_censored=len(points) - len(exact),
        median_abs_err_pct=median(abs_errs) if abs_errs else None,
        p95_abs_err_pct=quantile(abs_errs, 0.95) if abs_errs else None,
        max_abs_err_pct=max(abs_errs) if abs_errs else None,
        bias_pct=sum(errs) / len(errs) if errs else None,
        margin=margin,
        under_rate_pct=100.0 * sum(under) / len(under) if under else None,
        median_slack_pct=median(slack) if slack else None,
    )


def table(points: Iterable[Point], margins: dict[tuple[str, str], float]) -> list[CellStats]:
    """Stats per (gpu, trainer, technique, peak); `margins[(gpu, peak)]` is the safe-bound margin (0 if absent)."""
    cells: dict[tuple[str, str, str, str], list[Point]] = {}
    for p in points:
        cells.setdefault((p.gpu, p.trainer, p.technique, p.peak), []).append(p)
    out = []
    for key in sorted(cells, key=lambda k: (k[0], k[1], k[2], PEAKS.index(k[3]) if k[3] in PEAKS else 9)):
        out.append(cell_stats(cells[key], margins.get((key[0], key[3]), 0.0)))
    return out


def render(rows: list[CellStats]) -> str:
    """A fixed-width table, one line per cell and peak."""
    head = ("gpu", "trainer", "technique", "peak", "n", "oom", "med|err|%", "p95%", "max%", "bias%", "margin%",
            "under%", "slack%")
    lines = [head]
    for r in rows:
        lines.append((r.gpu, r.trainer, r.technique, r.peak, str(r.n), str(r.n_censored),
                      _pct(r.median_abs_err_pct), _pct(r.p95_abs_err_pct), _pct(r.max_abs_err_pct), _pct(r.bias_pct),
                      _pct(100.0 * r.margin), _pct(r.under_rate_pct), _pct(r.median_slack_pct)))
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    text = ["  ".join(cell.ljust(w) if i < 4 else cell.rjust(w) for i, (cell, w) in enumerate(zip(line, widths)))
            for line in lines]
    text.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(text)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"

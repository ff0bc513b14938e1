"""False fits and false refusals at the OOM boundary (`hpcmem validate boundary`; stdlib + the estimator).

The runs: probe records whose predicted peak is WINDOW (85–105 %) of the capacity they ran against — the GPU kit's
boundary sweep makes them (hpcmem.probe.boundary), any other record in the window counts too. Each is judged twice
and held to what happened (it ran, or it ran out of memory):

    point      fits when the predicted peak ≤ capacity
    safe       fits when the safe bound ≤ capacity (hpcmem.estimate.verdict: "tight" is a refusal)
    false fit      said fits, ran out of memory       (the target: 0 with the safe bound)
    false refusal  said it does not fit, it ran      (the target: ≤ 10 % of the runs)

Capacity: the run's simulated capacity (`--capacity-bytes`) or the GPU's total as torch reported it. The peak is
the device peak on a GPU (the reserved peak under a simulated capacity, which caps the allocator); on CPU dry runs
the tracked tensor bytes (no cuBLAS workspaces, no margin: none is fitted
for CPU). Predictions are the current estimator's, the margin the GPU's current calibration; a record made before
that calibration was fitted may have been fitted on (`in_sample`), one made after is held out.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcmem.estimate.verdict import judge
from hpcmem.gpus.calibration import load_calibration
from hpcmem.record import Record
from hpcmem.validate.probes import estimate_for, load, record_job

WINDOW = (0.85, 1.05)


@dataclass(frozen=True)
class Row:
    case: str
    gpu: str
    predicted_bytes: int
    safe_bytes: int
    capacity_bytes: int
    ran: bool
    in_sample: bool | None

    @property
    def fraction(self) -> float:
        return self.predicted_bytes / self.capacity_bytes

    @property
    def point_fits(self) -> bool:
        return self.predicted_bytes <= self.capacity_bytes

    @property
    def safe_fits(self) -> bool:
        return self.safe_bytes <= self.capacity_bytes


def row_of(rec: Record, estimate: dict[str, Any]) -> Row | None:
    """The boundary judgement of one record (None when it has no capacity or prediction to judge)."""
    per_gpu = estimate.get("per_gpu") or {}
    simulated = rec.run.capacity_bytes
    capacity = simulated or (rec.gpu.memory_bytes if rec.gpu else None)
    on_gpu = rec.device != "cpu"
    if on_gpu:       # a simulated capacity caps the allocator (set_per_process_memory_fraction): the reserved peak
        predicted = per_gpu.get("peak_reserved_bytes" if simulated else "device_peak_bytes")
    else:
        components = per_gpu.get("components") or {}
        predicted = (per_gpu.get("peak_allocated_bytes") or 0) - components.get("cuBLAS workspaces", 0)
    if not capacity or not predicted or not rec.finished:
        return None
    gpu = record_job(rec).gpu if on_gpu else None
    spread = int(per_gpu.get("reserved_spread_bytes") or 0) if on_gpu else 0
    safe = int(predicted) if gpu is None else \
        judge(int(predicted), dataclasses.replace(gpu, capacity_bytes=int(capacity)), spread).safe_device_peak_bytes
    cal = load_calibration(gpu.name) if gpu is not None and gpu.calibrated else None
    fitted = ((cal or {}).get("provenance") or {}).get("fitted_at")
    return Row(case=str(rec.case or rec.id or "?")[:40], gpu=gpu.name if gpu else "cpu",
               predicted_bytes=int(predicted), safe_bytes=int(safe), capacity_bytes=int(capacity),
               ran=rec.status == "ok", in_sample=None if not fitted else str(rec.created or "") < fitted)


def rows(paths: list[str | Path], *, stored: bool = False, gpu: str | None = None,
         window: tuple[float, float] = WINDOW) -> tuple[list[Row], list[str]]:
    loaded = load(paths, gpu=gpu, estimate=False)       # records only; the estimate is made below
    out, notes = [], list(loaded.notes)
    for rec in loaded.records:
        est, note = estimate_for(rec, stored)
        if note:
            notes.append(note)
        row = row_of(rec, est) if est else None
        if row is not None and window[0] <= row.fraction <= window[1]:
            out.append(row)
    return out, notes


def summary(table: list[Row]) -> dict[str, Any]:
    """Counts per judgement: runs, OOMs, false fits, false refusals (and the refusal rate among runs)."""
    out: dict[str, Any] = {"runs": len(table), "ran": sum(r.ran for r in table),
                           "oom": sum(not r.ran for r in table)}
    for name, fits in (("point", lambda r: r.point_fits), ("safe", lambda r: r.safe_fits)):
        false_fits = sum(fits(r) and not r.ran for r in table)
        false_refusals = sum(not fits(r) and r.ran for r in table)
        out[name] = {"false_fits": false_fits, "false_refusals": false_refusals,
                     "false_refusal_rate_pct": round(100 * false_refusals / len(table), 1) if table else None}
    return out


def render(table: list[Row]) -> str:
    head = f"{'case':<40} {'gpu':<10} {'pred/cap':>8} {'safe/cap':>8} {'outcome':>7} {'point':>8} {'safe':>8}"
    lines = [head, "-" * len(head)]
    for r in sorted(table, key=lambda r: r.fraction):
        lines.append(f"{r.case:<40} {r.gpu:<10} {100 * r.fraction:7.1f}% {100 * r.safe_bytes / r.capacity_bytes:7.1f}%"
                     f" {'ran' if r.ran else 'OOM':>7} {_call(r.point_fits, r.ran):>8} {_call(r.safe_fits, r.ran):>8}")
    s = summary(table)
    lines.append(f"{s['runs']} runs in the window ({s['ran']} ran, {s['oom']} OOM) · point estimate: "
                 f"{s['point']['false_fits']} false fits, {s['point']['false_refusals']} false refusals · safe bound: "
                 f"{s['safe']['false_fits']} false fits, {s['safe']['false_refusals']} false refusals")
    return "\n".join(lines)


def _call(fits: bool, ran: bool) -> str:
    if fits:
        return "fits" if ran else "FALSE-FIT"
    return "refused" if not ran else "FALSE-REF"

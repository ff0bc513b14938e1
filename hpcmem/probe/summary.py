"""A probe record in a few lines for the terminal (stdlib)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

GIB = 1024**3


def _gib(value: Any) -> str:
    return "-" if value is None else f"{value / GIB:.3f} GiB"


def summary(record: Any, path: str | Path | None = None) -> str:
    """`record` is an hpcmem.record.Record; `path` the file it was appended to (None: not written)."""
    m = record.measured
    trainer, technique = record.cell
    on = f" ({record.gpu_name})" if record.gpu else ""
    lines = [f"probe {trainer} {technique} on {record.device}{on}: {record.status}"]
    if record.status == "oom" and m.oom is not None:
        verdict = m.oom.extra.get("verdict", "did not fit")
        lines.append(f"  {verdict} (step {m.oom.step}, {m.oom.phase})")
    lines.append(f"  {'peak':<10} {'measured':>14} {'estimate':>14}")
    for name in ("allocated", "reserved", "device"):
        lines.append(f"  {name:<10} {_gib(m.peak(name)):>14} {_gib(record.predicted(name)):>14}")
    if m.peak_phase:
        lines.append(f"  measured peak in: {m.peak_phase} (estimate: {(record.estimate or {}).get('per_gpu', {}).get('phase', '-')})")
    if m.step_times_s:
        rate = f", {m.tokens_per_s:,.0f} tokens/s per GPU" if m.tokens_per_s else ""
        lines.append(f"  steps after step 0: {len(m.step_times_s)}, "
                     f"{sum(m.step_times_s) / len(m.step_times_s):.3f} s each{rate}")
    if record.estimate is None:
        lines.append(f"  estimate: none ({record.estimate_error})")
    phases = (record.estimate or {}).get("phases") or {}
    for r in m.ranks or (m,):
        if r is not m:
            why = f" ({r.extra['reason']})" if r.extra.get("reason") else ""
            lines.append(f"  rank {r.rank}: {r.status} allocated {_gib(r.peak_allocated_bytes)}{why}")
        for name, jp in (r.extra.get("job_phases") or {}).items():      # hpcmem probe --after
            grew = jp["rss_peak_bytes"] - jp["rss_before_bytes"]
            lines.append(f"    {name}: allocated {_gib(jp.get('allocated_bytes'))} (estimate {_gib(phases.get(name))}),"
                         f" RSS +{_gib(grew)}")
    if path:
        lines.append(f"  record appended to {path}")
    return "\n".join(lines)

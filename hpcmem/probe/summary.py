"""A probe record in a few lines for the terminal (stdlib)."""

from __future__ import annotations

from typing import Any

GIB = 1024**3


def _gib(value: Any) -> str:
    return "-" if value is None else f"{value / GIB:.3f} GiB"


def summary(record: dict[str, Any]) -> str:
    m = record.get("measured") or {}
    est = (record.get("estimate") or {}).get("per_gpu") or {}
    cell = record.get("cell") or {}
    lines = [f"probe {cell.get('trainer')} {cell.get('technique')} on {record.get('device')}"
             f"{' (' + str((record.get('gpu') or {}).get('gpu_name')) + ')' if record.get('gpu') else ''}: "
             f"{record.get('status')}"]
    if record.get("status") == "oom":
        lines.append(f"  {m.get('oom', {}).get('verdict', 'did not fit')} "
                     f"(step {m.get('oom', {}).get('step')}, {m.get('oom', {}).get('phase')})")
    lines.append(f"  {'peak':<10} {'measured':>14} {'estimate':>14}")
    for name, mk, ek in (("allocated", "peak_allocated_bytes", "peak_allocated_bytes"),
                         ("reserved", "peak_reserved_bytes", "peak_reserved_bytes"),
                         ("device", "device_peak_bytes", "device_peak_bytes")):
        lines.append(f"  {name:<10} {_gib(m.get(mk)):>14} {_gib(est.get(ek)):>14}")
    if m.get("peak_phase"):
        lines.append(f"  measured peak in: {m['peak_phase']} (estimate: {est.get('phase', '-')})")
    if record.get("estimate") is None:
        lines.append(f"  estimate: none ({record.get('estimate_error')})")
    phases = (record.get("estimate") or {}).get("phases") or {}
    for r in m.get("ranks") or [m]:
        if r is not m:
            why = f" ({r['reason']})" if r.get("reason") else ""
            lines.append(f"  rank {r.get('rank')}: {r.get('status')} allocated "
                         f"{_gib(r.get('peak_allocated_bytes'))}{why}")
        for name, jp in (r.get("job_phases") or {}).items():
            grew = jp["rss_peak_bytes"] - jp["rss_before_bytes"]
            lines.append(f"    {name}: allocated {_gib(jp.get('allocated_bytes'))} (estimate {_gib(phases.get(name))}),"
                         f" RSS +{_gib(grew)}")
    if record.get("_path"):
        lines.append(f"  record appended to {record['_path']}")
    return "\n".join(lines)

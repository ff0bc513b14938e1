"""The estimate as a table a person reads (pure: returns text)."""

from __future__ import annotations

from hpcmem.estimate.breakdown import Estimate

GIB = 1024**3


def gib(n: int | float) -> str:
    return f"{n / GIB:8.2f} GiB"


def render(est: Estimate) -> str:
    peak = est.peak_phase
    lines = [est.summary, "", f"{'component':<30}{'per GPU':>14}   note"]
    for c in peak.components:
        if c.bytes:
            lines.append(f"{c.name:<30}{gib(c.bytes):>14}   {c.note}")
    lines.append("")
    lines.append(f"{'peak allocated':<30}{gib(est.peak_allocated_bytes):>14}   phase: {peak.name}")
    slack = est.reserved_extra_bytes / est.peak_allocated_bytes if est.peak_allocated_bytes else 0.0
    lines.append(f"{'peak reserved':<30}{gib(est.peak_reserved_bytes):>14}   allocator slack "
                 f"{est.reserved_extra_bytes / GIB:.2f} GiB ({100 * slack:.1f} % of allocated, from the caching "
                 f"allocator's mechanics; estimate/allocator.py"
                 + (f"; incl. {est.reserved_pool_bytes / GIB:.2f} GiB of FSDP's all-gather stream pool, "
                    "estimate/fsdp_units.py" if est.reserved_pool_bytes else "") + ")")
    if est.reserved_spread_bytes:
        lines.append(f"{'':<30}{'':>14}   ± {est.reserved_spread_bytes / 2 / GIB:.2f} GiB: whether step 2 maps "
                     f"{est.reserved_spread_note} ({est.reserved_spread_bytes / GIB:.2f} GiB) again depends on where "
                     "MiB-sized blocks sit (default allocator) or on the order the step's blocks fill freed memory "
                     "(expandable segments), which the estimate does not replay")
    if est.reserved_shapes_bytes:
        lines.append(f"{'':<30}{'':>14}   + up to {est.reserved_shapes_bytes / GIB:.2f} GiB "
                     f"{est.reserved_shapes_note}; a full GPU frees cached blocks instead, so the job needs "
                     f"{est.shapes_needed_bytes / GIB:.2f} GiB of it")
    verdict = est.verdict
    where = (f"of {verdict.capacity_bytes / GIB:.1f} GiB usable on {est.gpu_name}" if verdict else "")
    lines.append(f"{'device peak':<30}{gib(est.device_peak_bytes):>14}   {where}")
    lines.append(f"{'':<30}{'':>14}   ({est.device_note})")
    if verdict:
        lines.append(f"{'verdict':<30}{'':>14}   {verdict.line()}")
    if est.host_bytes:
        lines.append(f"{'host RAM per process':<30}{gib(est.host_bytes):>14}   offloaded states/activations")
    if est.host is not None:
        lines.append(_host_line(est.host))
    lines.append("")
    lines.append("phases (allocated):")
    width = max([28] + [len(p.name) + 2 for p in est.phases])     # a long name ("backward (cross-attention layer)")
    for p in est.phases:
        mark = "  ← peak" if p is peak else ""
        lines.append(f"  {p.name:<{width}}{gib(p.bytes):>14}{mark}")
    if est.made != "derived":
        lines.append(f"layer terms: {est.made}")
    for a in est.assumed:
        lines.append(f"assumed: {a['field']} {a['value']} ({a['why']}; set it with {a['set_with']})")
    for w in est.warnings:
        lines.append(f"warning: {w}")
    lines.append("not modelled: " + "; ".join(est.not_modelled))
    return "\n".join(lines)


def _host_line(host) -> str:
    peak = host.peak_phase
    others = f" + {host.ranks_per_node - 1} × {peak.other_bytes / GIB:.1f}" if host.ranks_per_node > 1 else ""
    workers = f" + workers {host.workers.bytes / GIB:.1f}" if host.workers.bytes else ""
    return (f"{'host RAM per node':<30}{gib(host.per_node_bytes):>14}   phase: {peak.name} (rank 0 "
            f"{peak.rank0_bytes / GIB:.1f}{others}{workers}; process baseline uncalibrated off the H200)")

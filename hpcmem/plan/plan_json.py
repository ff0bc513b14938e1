"""`hpcmem plan --json`: the report as one JSON object (the table's numbers, reasons, flags and assumptions)."""

from __future__ import annotations

from hpcmem.plan.best_first import PlanReport, not_fitting
from hpcmem.plan.explain import margin_info, reasons
from hpcmem.plan.flags import changed_flags
from hpcmem.plan.knobs import apply
from hpcmem.plan.ranking import headroom_share
from hpcmem.plan.throughput import THROUGHPUT_UNCERTAINTY


def _plan(report: PlanReport, p) -> dict:
    return {
        "rank": p.rank,
        "knobs": p.knobs._asdict(),
        "label": p.knobs.label(report.base.parallel.world_size == 1),
        "equivalents": [q._asdict() for q in p.equivalents],
        "peak_allocated_bytes": p.peak_allocated_bytes,
        "device_peak_bytes": p.device_peak_bytes,
        "safe_device_peak_bytes": p.safe_device_peak_bytes,
        "capacity_bytes": report.gpu.usable_bytes,
        "headroom_bytes": p.headroom_bytes,
        "headroom_share": headroom_share(p),
        "host_per_node_bytes": p.estimate.host.per_node_bytes if p.estimate.host else None,
        "tokens_per_s_per_gpu": p.speed.tokens_per_s_per_gpu,
        "step_s": p.speed.step_s,
        "mfu": p.speed.mfu,
        "reasons": reasons(report, p),
        "flags": changed_flags(report.base, p.job),
    }


def _assumed(report: PlanReport) -> list[str]:
    """What the plans rest on that nobody gave: the catalog's host RAM per node."""
    src = report.host_capacity_source
    return [f"host RAM per node {src}"] if src.startswith(("assumed", "not checked")) else []


def to_json(report: PlanReport) -> dict:
    s = report.stats
    low = report.least
    floor = report.headroom
    return {
        "gpu": report.gpu.name,
        "capacity_bytes": report.gpu.usable_bytes,
        "margin": margin_info(report),
        "ranking": f"bands of plans within {100 * THROUGHPUT_UNCERTAINTY:.0f} % tokens/s of the band's fastest "
                   "(the throughput model's stated uncertainty); inside a band, most headroom first, then speed",
        "world_size": report.base.parallel.world_size,
        "global_batch_size": report.global_batch_size,
        "fixed": list(report.fixed),
        "note": report.note or None,
        "host_capacity_bytes": report.host_capacity_bytes,
        "host_capacity_source": report.host_capacity_source or None,
        "assumed": _assumed(report),
        "headroom_floor_bytes": floor.bytes_for(report.gpu.usable_bytes) if floor else None,
        "dropped_by_headroom": sum(v.how == "headroom" for v in report.walked) if floor else None,
        "plans": [_plan(report, p) for p in report.plans],
        # no plan fits: the combination estimated in full with the lowest device peak (those the monotone bound
        # rejected unestimated are not in it: their bound says only that they do not fit)
        "least": None if low is None else {
            "knobs": low[0]._asdict(), "device_peak_bytes": low[1].device_peak_bytes, "why": not_fitting(low[1]),
            "flags": changed_flags(report.base, apply(report.base, low[0]))},
        "rejected_faster": [{"knobs": v.knobs._asdict(), "tokens_per_s_per_gpu": v.speed.tokens_per_s_per_gpu,
                             "why": v.why, "how": v.how}
                            for v in report.walked if not v.fits and report.plans and
                            v.speed.tokens_per_s_per_gpu > report.plans[0].speed.tokens_per_s_per_gpu],
        "stats": {"combinations": s.combinations, "full_estimates": s.full_estimates,
                  "bound_rejected": s.bound_rejected, "rule_rejected": s.rule_rejected,
                  "rank_pruned": s.rank_pruned, "seconds": s.seconds},
    }

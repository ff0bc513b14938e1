"""The planner's search as a picture (`hpcmem plan … --plot FILE.png`): every fully estimated combination as speed
against safe device peak, the GPU's usable capacity as a line, the plans offered marked and the chosen one starred.

x: the safe bound (device peak × (1 + the GPU's margin), hpcmem.estimate.verdict) — what decides whether a plan is
offered; y: the throughput model's tokens/s per GPU (a ranking model, not a measurement). The axes are bounded by the
offered plans and the capacity, not by the farthest combination (a 70B job's unsharded one needs over 1 TiB): a point
outside them is pinned to the edge it lies beyond, with an arrow marker, so every class drawn stays visible. Per
offered plan a bar runs from its device peak to its safe bound (the margin) and a thin one on to the capacity (its
headroom). Combinations that fit the GPU but not the node's host RAM, and those under a --headroom floor, are drawn
apart. Combinations the search rejected without a full estimate (a monotone bound or TRL's rules) have no peak of
their own and are only counted in the legend.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpcmem.estimate.verdict import safe_bound
from hpcmem.plots.mpl import GIB, pyplot, save

KINDS = {"estimate": "does not fit", "host": "host RAM over the node's", "headroom": "under the headroom floor"}
STYLES = {"fits": dict(color="#7fa7d1", marker="o"), "does not fit": dict(color="#999999", marker="x"),
          "host RAM over the node's": dict(color="#e3a857", marker="^"),
          "under the headroom floor": dict(color="#9b59b6", marker="d")}
PAD = 0.08          # share of the span left beside the outermost plan or the capacity line


def points(report: Any) -> dict[str, list[tuple[float, float]]]:
    """(safe bound GiB, tokens/s) of the walked combinations, by what became of them."""
    offered = {p.knobs for p in report.plans}
    out: dict[str, list[tuple[float, float]]] = {"fits": [], **{k: [] for k in KINDS.values()}}
    for v in report.walked:
        if v.how not in KINDS or v.device_peak_bytes is None or v.knobs in offered:
            continue
        safe = safe_bound(v.device_peak_bytes, report.gpu, v.spread_bytes, report.base.parallel.world_size,
                          v.shapes_bytes) / GIB
        out["fits" if v.fits else KINDS[v.how]].append((safe, v.speed.tokens_per_s_per_gpu))
    return out


def limits(report: Any, pts: dict[str, list[tuple[float, float]]]) -> tuple[tuple[float, float], tuple[float, float]]:
    """(x limits, y limits): x spans the offered plans' device peaks to the capacity (or the largest safe bound
    offered), y the offered plans' speeds and those of the points drawn inside that x span."""
    capacity = report.gpu.usable_bytes / GIB
    plans = list(report.plans)
    x_lo = min((p.device_peak_bytes / GIB for p in plans), default=0.0)
    x_hi = max([capacity] + [p.safe_device_peak_bytes / GIB for p in plans])
    span = max(x_hi - x_lo, 0.05 * x_hi)
    x = (max(0.0, x_lo - PAD * span), x_hi + PAD * span)
    ys = [p.speed.tokens_per_s_per_gpu for p in plans] + [s for v in pts.values() for g, s in v if x[0] <= g <= x[1]]
    ys = ys or [s for v in pts.values() for _, s in v] or [0.0, 1.0]
    y_span = max(max(ys) - min(ys), 0.05 * max(ys), 1.0)
    return x, (max(0.0, min(ys) - PAD * y_span), max(ys) + PAD * y_span)


def _scatter(ax: Any, pts: dict, x: tuple[float, float], y: tuple[float, float]) -> None:
    """Each class: its points inside the axes as themselves, those outside pinned to the edge with an arrow."""
    for kind, xy in pts.items():
        if not xy:
            continue
        inside = [(g, s) for g, s in xy if x[0] <= g <= x[1] and y[0] <= s <= y[1]]
        pinned = [(min(max(g, x[0]), x[1]), min(max(s, y[0]), y[1])) for g, s in xy if (g, s) not in inside]
        style = STYLES[kind]
        if inside:
            ax.scatter(*zip(*inside), s=18, label=f"{kind} ({len(xy)})", **style)
        if pinned:
            arrow = ">" if any(g > x[1] for g, _ in xy) else "<"
            ax.scatter(*zip(*pinned), s=30, color=style["color"], marker=arrow, clip_on=False,
                       label=f"{kind}: {len(pinned)} beyond the axes, pinned at the edge")


def _plans(ax: Any, report: Any, capacity: float) -> None:
    """Per offered plan: device peak → safe bound (the margin), safe bound → capacity (the headroom); #1 starred."""
    plans = list(report.plans)
    for i, p in enumerate(plans):
        dev, safe, tps = p.device_peak_bytes / GIB, p.safe_device_peak_bytes / GIB, p.speed.tokens_per_s_per_gpu
        ax.plot([dev, safe], [tps, tps], color="#2e7d32", linewidth=2.5, solid_capstyle="butt",
                label="device peak → safe bound (margin)" if i == 0 else None)
        ax.plot([safe, capacity], [tps, tps], color="#2e7d32", linewidth=0.8, linestyle=":",
                label="headroom: safe bound → capacity" if i == 0 else None)
    if len(plans) > 1:
        ax.scatter([p.safe_device_peak_bytes / GIB for p in plans[1:]], [p.speed.tokens_per_s_per_gpu for p in plans[1:]],
                   color="#2e7d32", marker="o", s=40, zorder=4, label=f"offered (#2–#{len(plans)})")
    if plans:
        best = plans[0]
        at = (best.safe_device_peak_bytes / GIB, best.speed.tokens_per_s_per_gpu)
        ax.scatter(*at, color="#c0392b", marker="*", s=260, zorder=5,
                   label=f"chosen (#1): {best.headroom_bytes / GIB:.1f} GiB free")
        ax.annotate(best.knobs.label(report.base.parallel.world_size == 1), at, textcoords="offset points",
                    xytext=(0, 12), ha="center", fontsize=8, color="#c0392b")


def figure(report: Any) -> Any:
    """The picture as a matplotlib Figure (draw() saves it)."""
    plt = pyplot("hpcmem plan --plot")
    fig, ax = plt.subplots(figsize=(9, 5.6))
    capacity = report.gpu.usable_bytes / GIB
    pts = points(report)
    x, y = limits(report, pts)
    _scatter(ax, pts, x, y)
    _plans(ax, report, capacity)
    ax.axvline(capacity, color="#444444", linestyle="--", linewidth=1.2, label=f"usable capacity {capacity:.1f} GiB")
    s = report.stats
    skipped = s.bound_rejected + s.rule_rejected + s.rank_pruned
    ax.scatter([], [], color="none", label=f"not estimated: {skipped} (bound, TRL rules, slower than the plans)")
    base = report.base
    ax.set_title(f"hpcmem plan · {base.train.trainer} · {base.model.name} · {base.parallel.world_size}×"
                 f"{report.gpu.name} · {s.combinations} combinations", fontsize=10)
    ax.set_xlabel("safe bound of the device peak per GPU (GiB)")
    ax.set_ylabel("tokens/s per GPU (ranking model, uncalibrated)")
    ax.set_xlim(*x)
    ax.set_ylim(*y)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    return fig


def draw(report: Any, path: str | Path) -> Path:
    return save(figure(report), path)

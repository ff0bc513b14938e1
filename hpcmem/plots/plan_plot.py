"""The planner's search as a picture (`hpcmem plan … --plot FILE.png`): every fully estimated combination as speed
against safe device peak, the GPU's usable capacity as a line, the plans offered marked and the chosen one starred.

x: the safe bound (device peak × (1 + the GPU's margin), hpcmem.estimate.verdict) — what decides whether a plan is
offered; y: the throughput model's tokens/s per GPU (a ranking model, not a measurement). Combinations that fit the
GPU but not a preset's host RAM per node are drawn apart. Combinations the search rejected without a full estimate
(a monotone bound or TRL's rules) have no peak of their own and are only counted in the legend.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpcmem.estimate.verdict import safe_bound
from hpcmem.plots.mpl import GIB, pyplot, save


def points(report: Any) -> dict[str, list[tuple[float, float]]]:
    """(safe bound GiB, tokens/s) of the walked combinations, by what became of them."""
    offered = {p.knobs for p in report.plans}
    out: dict[str, list[tuple[float, float]]] = {"fits": [], "does not fit": [], "host RAM over the node's": []}
    for v in report.walked:
        if v.how not in ("estimate", "host") or v.device_peak_bytes is None or v.knobs in offered:
            continue
        safe = safe_bound(v.device_peak_bytes, report.gpu, v.spread_bytes) / GIB
        kind = "host RAM over the node's" if v.how == "host" else "fits" if v.fits else "does not fit"
        out[kind].append((safe, v.speed.tokens_per_s_per_gpu))
    return out


def draw(report: Any, path: str | Path) -> Path:
    plt = pyplot("hpcmem plan --plot")
    fig, ax = plt.subplots(figsize=(9, 5.6))
    capacity = report.gpu.usable_bytes / GIB
    styles = {"fits": dict(color="#7fa7d1", marker="o", s=18), "does not fit": dict(color="#bbbbbb", marker="x", s=18),
              "host RAM over the node's": dict(color="#e3a857", marker="^", s=18)}
    for kind, pts in points(report).items():
        if pts:
            ax.scatter(*zip(*pts), label=f"{kind} ({len(pts)})", **styles[kind])
    plans = list(report.plans)
    if plans:
        ax.scatter([p.safe_device_peak_bytes / GIB for p in plans[1:]],
                   [p.speed.tokens_per_s_per_gpu for p in plans[1:]], color="#2e7d32", marker="o", s=40,
                   label=f"offered (#2–#{len(plans)})" if len(plans) > 1 else None)
        best = plans[0]
        ax.scatter([best.safe_device_peak_bytes / GIB], [best.speed.tokens_per_s_per_gpu], color="#c0392b",
                   marker="*", s=260, zorder=5, label="chosen (#1)")
        ax.annotate(best.knobs.label(), (best.safe_device_peak_bytes / GIB, best.speed.tokens_per_s_per_gpu),
                    textcoords="offset points", xytext=(0, 12), ha="center", fontsize=8, color="#c0392b")
    ax.axvline(capacity, color="#444444", linestyle="--", linewidth=1.2,
               label=f"usable capacity {capacity:.1f} GiB")
    s = report.stats
    skipped = s.bound_rejected + s.rule_rejected + s.rank_pruned
    ax.scatter([], [], color="none", label=f"not estimated: {skipped} (bound, TRL rules, slower than the plans)")
    base = report.base
    ax.set_title(f"hpcmem plan · {base.train.trainer} · {base.model.name} · {base.parallel.world_size}×"
                 f"{report.gpu.name} · {s.combinations} combinations", fontsize=10)
    ax.set_xlabel("safe bound of the device peak per GPU (GiB)")
    ax.set_ylabel("tokens/s per GPU (ranking model, uncalibrated)")
    ax.set_xlim(left=0)
    ax.margins(y=0.15)                  # speeds differ by a few %: a zero-based axis would flatten them
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    return save(fig, path)

"""The scatter of predicted vs measured peaks (log axes, one colour per trainer, one marker per peak). matplotlib
is imported only when the picture is drawn (hpcmem.plots.mpl), so the table needs neither a display nor matplotlib."""

from __future__ import annotations

from pathlib import Path

from hpcmem.plots.mpl import pyplot, save
from hpcmem.validate.table import Point

MARKERS = {"allocated": "o", "reserved": "s", "device": "^"}
GIB = 1024**3
MIB = 1024**2


def scatter(points: list[Point], path: str | Path, title: str = "hpcmem: estimate vs probe") -> Path:
    plt = pyplot("the accuracy scatter (--png)")
    from matplotlib.ticker import NullFormatter

    fig, ax = plt.subplots(figsize=(6.4, 6.0), dpi=120)
    top = max([max(p.predicted, p.measured) for p in points] or [GIB])
    scale, unit = (GIB, "GiB") if top >= GIB else (MIB, "MiB")
    trainers = sorted({p.trainer for p in points})
    colours = {t: plt.get_cmap("tab10")(i % 10) for i, t in enumerate(trainers)}
    for t in trainers:
        for peak, marker in MARKERS.items():
            sel = [p for p in points if p.trainer == t and p.peak == peak]
            if not sel:
                continue
            ax.scatter([p.predicted / scale for p in sel], [p.measured / scale for p in sel], c=[colours[t]],
                       marker=marker, s=28, alpha=0.8, label=f"{t} {peak}", edgecolors="k",
                       linewidths=[1.5 if p.censored else 0.0 for p in sel])
    values = [v / scale for p in points for v in (p.predicted, p.measured)] or [1e-3, 1.0]
    lo, hi = min(values) / 1.5, max(values) * 1.5
    ax.plot([lo, hi], [lo, hi], color="grey", lw=1, ls="--", label="y = x")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(f"predicted ({unit})")
    ax.set_ylabel(f"measured ({unit}; black edge: OOM, need ≥ capacity)")
    ax.set_title(title)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return save(fig, path, dpi="figure")

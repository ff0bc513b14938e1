"""An estimate as a picture (`hpcmem estimate … --plot FILE.png`): each phase of the job as a bar of stacked
components, with the GPU's usable capacity, the device peak and its safe bound drawn across.

Bars are what one GPU holds at each phase's worst instant (allocated: the components the estimate names, the same
numbers as the table). The peak phase's bar continues above its allocated bytes with what is not a live tensor —
the caching allocator's slack (reserved − allocated) and what lives outside PyTorch's allocator (CUDA context,
NCCL, vLLM's pool) — up to the device peak, which is what the verdict compares (hpcmem.estimate.verdict).

With more than one GPU rank every rank holds the same GPU bytes (the estimate is per rank), but the ranks do not hold
the same host RAM: rank 0 loads, gathers and writes what the others do not. A second panel then shows host RAM by
phase for rank 0 and for each other rank of a node, stacked by component, with the node's total written above
(hpcmem.estimate.host).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpcmem.plots.mpl import GIB, pyplot, save

PALETTE = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c", "#ccb974",
           "#64b5cd", "#1f4e79", "#a1c9f4", "#ffb482", "#8de5a1", "#ff9f9b", "#d0bbff")
SLACK, OUTSIDE = "allocator slack (reserved − allocated)", "outside PyTorch (context, NCCL, vLLM)"


def stacks(est: Any) -> tuple[list[str], list[str], dict[str, list[float]]]:
    """(phase names, component names in first-seen order, GiB per component per phase) — the peak phase's bar gets
    the two non-tensor terms on top."""
    phases = [p.name for p in est.phases]
    names: list[str] = []
    for p in est.phases:
        for c in p.components:
            if c.bytes and c.name not in names:
                names.append(c.name)
    values = {n: [0.0] * len(phases) for n in names}
    for i, p in enumerate(est.phases):
        for c in p.components:
            if c.bytes:
                values[c.name][i] += c.bytes / GIB
    peak = phases.index(est.peak_phase.name)
    for name, extra in ((SLACK, est.reserved_extra_bytes), (OUTSIDE, est.device_extra_bytes)):
        if extra:
            names.append(name)
            values[name] = [extra / GIB if i == peak else 0.0 for i in range(len(phases))]
    return phases, names, values


def draw(est: Any, path: str | Path, *, world_size: int = 1, title: str = "") -> Path:
    """The PNG; `world_size` > 1 (the job's GPU ranks) adds the host-RAM panel of rank 0 and the other ranks."""
    plt = pyplot("hpcmem estimate --plot")
    phases = [p.name for p in est.phases]
    ranks = est.host is not None and world_size > 1
    width = max(8.0, 1.25 * len(phases) + 4.0)
    if ranks:
        fig, (ax, host_ax) = plt.subplots(1, 2, figsize=(width + 6.5, 5.8), gridspec_kw={"width_ratios": [3, 2]})
        _host_panel(host_ax, est.host)
    else:
        fig, ax = plt.subplots(figsize=(width, 5.8))
    _gpu_panel(ax, est)
    fig.suptitle(title or _wrap(est.summary, 150, max_lines=3), fontsize=8)
    fig.tight_layout()
    return save(fig, path)


def _gpu_panel(ax: Any, est: Any) -> None:
    phases, names, values = stacks(est)
    bottom = [0.0] * len(phases)
    xs = list(range(len(phases)))
    for i, name in enumerate(names):
        hatch = "//" if name in (SLACK, OUTSIDE) else None
        ax.bar(xs, values[name], bottom=bottom, color=PALETTE[i % len(PALETTE)], edgecolor="white", linewidth=0.5,
               hatch=hatch, label=name)
        bottom = [b + v for b, v in zip(bottom, values[name])]
    _lines(ax, est)
    ax.set_xticks(xs, [_wrap(p) for p in phases], fontsize=8)
    peak = phases.index(est.peak_phase.name)
    ax.get_xticklabels()[peak].set_fontweight("bold")
    ax.set_ylabel("GiB per GPU (every rank)")
    ax.set_title("GPU memory by phase", fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.set_ylim(0, max(max(bottom), _top(est)) * 1.12)


def _host_panel(ax: Any, host: Any) -> None:
    """Host RAM by phase: rank 0 and one other rank side by side, stacked by component."""
    names: list[str] = []
    for p in host.phases:
        for c in (*p.rank0, *p.other):
            if c.bytes and c.name not in names:
                names.append(c.name)
    colour = {n: PALETTE[(i + 6) % len(PALETTE)] for i, n in enumerate(names)}
    many = True
    for i, p in enumerate(host.phases):
        for j, (label, comps) in enumerate((("rank 0", p.rank0), ("each other rank", p.other))[:1 + many]):
            x, bottom = 3 * i + j, 0.0
            for c in comps:
                if c.bytes:
                    ax.bar(x, c.bytes / GIB, bottom=bottom, color=colour[c.name], edgecolor="white", linewidth=0.5,
                           label=c.name if c.name not in ax.get_legend_handles_labels()[1] else None)
                    bottom += c.bytes / GIB
            ax.annotate(label, (x, 0), xytext=(0, -12), textcoords="offset points", ha="center", fontsize=6,
                        rotation=0)
        node = host.node_bytes(p) / GIB
        ax.annotate(f"node {node:.1f} GiB", (3 * i + 0.5 * many, max(p.rank0_bytes, p.other_bytes) / GIB),
                    xytext=(0, 4), textcoords="offset points", ha="center", fontsize=7)
    ax.set_xticks([3 * i + 0.5 * many for i in range(len(host.phases))], [p.name for p in host.phases], fontsize=8)
    ax.tick_params(axis="x", pad=14)
    ax.set_ylabel("host RAM, GiB per process")
    ax.set_title(f"host RAM by phase ({host.ranks_per_node} rank(s) per node; node = rank 0 + "
                 f"{host.ranks_per_node - 1} × other + dataloader workers)", fontsize=8)
    ax.legend(fontsize=7, loc="upper left", frameon=False)
    ax.margins(y=0.15)


def _lines(ax: Any, est: Any) -> None:
    ax.axhline(est.device_peak_bytes / GIB, color="#333333", linestyle=":", linewidth=1,
               label=f"device peak {est.device_peak_bytes / GIB:.1f} GiB")
    v = est.verdict
    if v is None:
        return
    ax.axhline(v.safe_device_peak_bytes / GIB, color="#c0392b", linestyle="-.", linewidth=1.2,
               label=f"safe bound {v.safe_device_peak_bytes / GIB:.1f} GiB (+{100 * v.margin:.1f} %)")
    ax.axhline(v.capacity_bytes / GIB, color="#111111", linestyle="--", linewidth=1.4,
               label=f"{v.gpu_name} usable {v.capacity_bytes / GIB:.1f} GiB → {v.level}")


def _top(est: Any) -> float:
    v = est.verdict
    return max(est.device_peak_bytes, v.safe_device_peak_bytes if v else 0, v.capacity_bytes if v else 0) / GIB


def _wrap(name: str, width: int = 14, max_lines: int = 4) -> str:
    words, lines, line = name.split(), [], ""
    for w in words:
        if line and len(line) + len(w) + 1 > width:
            lines.append(line)
            line = w
        else:
            line = f"{line} {w}".strip()
    return "\n".join([*lines, line][:max_lines])

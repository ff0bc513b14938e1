"""A traced step's live device memory over time (`hpcmem trace … --timeline FILE.png`): the picture PyTorch's memory
viewer draws from a snapshot, without a browser.

x: allocation events in the order the trace counted them; y: live bytes after each (allocated, the CUDA mapping
applied); the background shows the phase (forward, backward, optimizer step … of each step) and the peak is marked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpcmem.plots.mpl import GIB, pyplot, save

from hpcmem.trace.snapshot import SETUP, live_series

MAX_POINTS = 4000
PHASE_COLOURS = ("#dbe9f6", "#fde2cf", "#dcefd9", "#eadcf1", "#f9f3c5", "#e8e8e8")


def phase_group(phase: str) -> str:
    """The first two levels of a trace phase ("step 2 / backward / layer 5" → "step 2 / backward")."""
    return " / ".join(phase.split(" / ")[:2]) if phase else SETUP


def spans(phases: list[str]) -> list[tuple[int, int, str]]:
    """Runs of equal phase groups: (first index, end index, group)."""
    out: list[tuple[int, int, str]] = []
    for i, p in enumerate(phases):
        g = phase_group(p)
        if out and out[-1][2] == g:
            out[-1] = (out[-1][0], i + 1, g)
        else:
            out.append((i, i + 1, g))
    return out


def downsample(series: list[int], limit: int = MAX_POINTS) -> tuple[list[int], list[int]]:
    """(x, y) with at most ~limit points, keeping each bucket's maximum so no peak is lost."""
    if len(series) <= limit:
        return list(range(len(series))), list(series)
    step = -(-len(series) // limit)
    xs, ys = [], []
    for start in range(0, len(series), step):
        chunk = series[start:start + step]
        top = max(range(len(chunk)), key=chunk.__getitem__)
        xs.append(start + top)
        ys.append(chunk[top])
    return xs, ys


def draw(live: list[int], phases: list[str], path: str | Path, *, title: str,
         capacity_bytes: int | None = None) -> Path:
    """The timeline PNG from live bytes per event and the phase of each event."""
    plt = pyplot("hpcmem trace --timeline")
    fig, ax = plt.subplots(figsize=(11, 4.8))
    groups = spans(phases)
    kinds = sorted({g.split(" / ")[-1] for _, _, g in groups})
    colour = {k: PHASE_COLOURS[i % len(PHASE_COLOURS)] for i, k in enumerate(kinds)}
    labelled: set[str] = set()
    for start, end, g in groups:
        kind = g.split(" / ")[-1]
        ax.axvspan(start, end, color=colour[kind], linewidth=0,
                   label=None if kind in labelled else kind)
        labelled.add(kind)
    xs, ys = downsample(live)
    ax.plot(xs, [y / GIB for y in ys], color="#1f4e79", linewidth=1.0)
    if live:
        peak_i = max(range(len(live)), key=live.__getitem__)
        ax.plot([peak_i], [live[peak_i] / GIB], "o", color="#c0392b")
        right = peak_i > 0.6 * len(live)
        ax.annotate(f"peak {live[peak_i] / GIB:.2f} GiB\n{phases[peak_i]}", (peak_i, live[peak_i] / GIB),
                    textcoords="offset points", xytext=(-10 if right else 10, 4), fontsize=8, color="#c0392b",
                    ha="right" if right else "left", va="bottom")
    for name, start, end in _steps(groups):
        ax.annotate(name, ((start + end) / 2, 1.0), xycoords=("data", "axes fraction"), xytext=(0, -12),
                    textcoords="offset points", ha="center", fontsize=9, color="#333333")
    if capacity_bytes:
        ax.axhline(capacity_bytes / GIB, color="#444444", linestyle="--", linewidth=1, label="GPU capacity")
    ax.set_xlim(0, max(len(live), 1))
    ax.set_ylim(0, max([*(y / GIB for y in ys), (capacity_bytes or 0) / GIB * 1.02, 1e-3]) * 1.15)
    ax.set_xlabel("allocation events (trace order)")
    ax.set_ylabel("live device memory (GiB, allocated)")
    ax.set_title(title, fontsize=10)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), fontsize=8, ncol=min(len(kinds) + 1, 6),
              frameon=False)
    fig.tight_layout()
    return save(fig, path)


def _steps(groups: list[tuple[int, int, str]]) -> list[tuple[str, int, int]]:
    """Contiguous runs of one training step ("step 2", first, end) long enough to be labelled (≥ 5 % of events)."""
    runs: list[tuple[str, int, int]] = []
    for start, end, g in groups:
        step = g.split(" / ")[0]
        if not step.startswith("step "):
            continue
        if runs and runs[-1][0] == step:
            runs[-1] = (step, runs[-1][1], end)
        else:
            runs.append((step, start, end))
    total = groups[-1][1] if groups else 0
    return [r for r in runs if r[2] - r[1] >= 0.05 * total]


def draw_recorder(recorder: Any, path: str | Path, *, title: str, capacity_bytes: int | None = None) -> Path:
    """The timeline of a hpcmem.trace.snapshot.SnapshotRecorder's stream."""
    return draw(live_series(recorder.events), recorder.phases, path, title=title, capacity_bytes=capacity_bytes)

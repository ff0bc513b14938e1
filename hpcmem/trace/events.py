"""The device allocation stream of a trace, kept so the caching-allocator model can replay it later in seconds.

`EventLog` is a `StorageTracker(allocator=...)` listener. It keeps, in the order the tracker counts them, every
device allocation (its byte count), every free (which allocation), and markers: the phase that runs (when it
changes) and the first matrix multiply of each CPU thread a CUDA run would use, per step — where cuBLAS takes its
workspaces through the caching allocator (hpcmem.trace.workspace_events). `replay()` feeds a stream to
`hpcmem.estimate.caching_allocator.CachingAllocator` (stdlib only) and returns its statistics, per step as well.

Stream format (JSON, gzip on disk): a list whose items are
    n ≥ 0          malloc of n bytes
    -d (d ≥ 1)     free of the malloc d items back (most frees are of recent blocks: small numbers compress well —
                   a GRPO step with generation, 1.7 M items, takes 90 KB)
    ["phase", s]   the tracker's phase from here on ("step 2 / backward / layer 3")
    ["gemm", t, k] first GEMM of thread t ("main" or "autograd") in this step; k "lt" for cuBLASLt's bias GEMM
                   (addmm with a 1-D bias), "blas" otherwise

Stdlib only at import (the tracker hands in torch op objects; this file compares them by name).
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# aten ops that run cuBLAS (aten/src/ATen/native/cuda/Blas.cpp); the packet name is enough to tell them apart
GEMM_PACKETS = frozenset({"mm", "addmm", "bmm", "baddbmm", "addmv", "mv", "addbmm", "_addmm_activation", "dot",
                          "vdot", "addr"})
AUTOGRAD_PHASE = "backward"
FORMAT = 2                       # stream format stored with every file (2: frees count back from themselves)      # the phase name hpcmem.trace.phases gives Accelerator.backward


def thread_of(phase: str) -> str:
    """On a GPU, backward kernels run on autograd's device thread, everything else on Python's thread."""
    return "autograd" if f"/ {AUTOGRAD_PHASE}" in phase else "main"


def step_of(phase: str | None) -> int:
    """"step 2 / backward" → 2; 0 before the first step (setup) and between steps."""
    if phase and phase.startswith("step "):
        head = phase.split(" / ", 1)[0]
        try:
            return int(head[5:])
        except ValueError:
            return 0
    return 0


def gemm_kind(packet: str, args: Any) -> str:
    """cuBLASLt serves addmm whose bias is 1-D (aten `addmm_out_cuda_impl` → `gemm_and_bias`); the rest is cuBLAS."""
    if packet in ("addmm", "_addmm_activation") and args and getattr(args[0], "dim", lambda: 0)() == 1:
        return "lt"
    return "blas"


@dataclass
class EventLog:
    """A tracker listener that records the stream (see the module docstring)."""

    events: list[Any] = field(default_factory=list)
    tracker: Any = None
    _phase: str | None = None
    _seen: set = field(default_factory=set)

    def bind(self, tracker: Any) -> None:
        """Called by StorageTracker with itself: the phase is read from it."""
        self.tracker = tracker

    def _sync_phase(self) -> None:
        phase = self.tracker.current_phase if self.tracker is not None else None
        if phase != self._phase:
            self._phase = phase
            self.events.append(["phase", phase])

    def malloc(self, nbytes: int) -> int:
        self._sync_phase()
        self.events.append(int(nbytes))
        return len(self.events) - 1

    def free(self, handle: int) -> None:
        self._sync_phase()
        self.events.append(handle - len(self.events))

    def op(self, func: Any, args: Any) -> None:
        """Called by the tracker after every op has registered its outputs (cuBLAS takes its workspace once the
        output exists: the structured kernel allocates `out` before it calls cuBLAS)."""
        packet = getattr(getattr(func, "overloadpacket", None), "__name__", "")
        if packet not in GEMM_PACKETS:
            return
        self._sync_phase()
        thread, kind = thread_of(self._phase or ""), gemm_kind(packet, args)
        key = (step_of(self._phase), thread, kind)
        if key not in self._seen:
            self._seen.add(key)
            self.events.append(["gemm", thread, kind])


def save(path: str | Path, meta: dict[str, Any], events: list[Any]) -> None:
    """Write meta + stream as gzip JSON (atomic: a temporary file, then rename)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    with gzip.open(tmp, "wt", encoding="utf-8") as fh:
        json.dump({**meta, "format": FORMAT, "events": events}, fh, separators=(",", ":"))
    tmp.replace(p)


def load(path: str | Path) -> dict[str, Any]:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return json.load(fh)

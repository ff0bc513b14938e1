"""The traced step as a PyTorch memory snapshot: what `torch.cuda.memory._snapshot()` would have recorded on a GPU.

`SnapshotRecorder` is an allocation listener for `StorageTracker(allocator=…)` (hpcmem/trace/tracker.py): every device
allocation the trace counts — with the CUDA kernel mapping applied (512-byte blocks, flash-attention and LM-head
workspaces, hpcmem/trace/kernels.py) — becomes an `alloc` event with the Python frames that made it, every death a
`free_requested` + `free_completed` pair, in the order the tracker counts them. The dict it writes has the layout of
torch's own snapshot (torch/cuda/memory.py `_snapshot`, read by torch/cuda/_memory_viz.py and by the viewer at
https://pytorch.org/memory_viz): `device_traces` (one list of events for device 0) and `segments` (the blocks alive at
the end, in one segment).

What differs from a GPU's snapshot, and why: addresses are made up (a block is reused by the next request of the same
size, otherwise the address space grows), so the "Allocator State History" view shows hpcmem's placement, not the
caching allocator's; the frames are Python only (the trace runs on the CPU: there are no C++ frames of CUDA code);
the first frame of every allocation names the hpcmem phase it was born in ("step 2 / backward / layer 5").
An inner listener (the caching-allocator model, hpcmem/estimate/caching_allocator.py) may be chained: it sees the same
calls.
"""

from __future__ import annotations

import pickle
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpcmem.errors import HpcmemError

BASE_ADDRESS = 0x7F0000000000      # where a CUDA allocation might start; any non-zero base works for the viewer
ALIGN = 512                        # c10/cuda/CUDACachingAllocator.cpp kMinBlockSize
MAX_FRAMES = 48
SETUP = "setup (before step 1)"
TEARDOWN = "outside a step (between steps, after the last)"
_SKIP_FILES = ("hpcmem/trace/tracker.py", "hpcmem/trace/snapshot.py", "torch/utils/_python_dispatch.py",
               "torch/_subclasses/fake_tensor.py", "torch/_subclasses/meta_utils.py")


class SnapshotRecorder:
    """malloc/free listener that keeps the allocation stream (see the module docstring)."""

    def __init__(self, inner: Any = None, *, phase: Callable[[], str] = lambda: "",
                 max_frames: int = MAX_FRAMES) -> None:
        self.inner = inner
        self.phase = phase                     # set by the caller to the tracker's current phase
        self.max_frames = max_frames
        self.events: list[dict[str, Any]] = []
        self.phases: list[str] = []            # the phase of each event, for the timeline picture
        self._live: dict[int, tuple[int, int, list, Any]] = {}     # handle -> (address, size, frames, inner handle)
        self._reuse: dict[int, list[int]] = {}                     # size -> freed addresses
        self._top = BASE_ADDRESS
        self._next_handle = 0
        self._frame_cache: dict[tuple[str, int, str], dict[str, Any]] = {}
        self._stepped = False

    # -- the listener protocol (StorageTracker) ------------------------------------------------------------------
    def malloc(self, nbytes: int) -> int:
        freed = self._reuse.get(nbytes)
        if freed:
            address = freed.pop()
        else:
            address = self._top
            self._top += -(-nbytes // ALIGN) * ALIGN
        frames = self._frames()
        inner = self.inner.malloc(nbytes) if self.inner is not None else None
        self._next_handle += 1
        self._live[self._next_handle] = (address, nbytes, frames, inner)
        self._event("alloc", address, nbytes, frames)
        return self._next_handle

    def free(self, handle: int) -> None:
        address, nbytes, frames, inner = self._live.pop(handle)
        if self.inner is not None and inner is not None:
            self.inner.free(inner)
        self._event("free_requested", address, nbytes, frames)
        self._event("free_completed", address, nbytes, frames)
        self._reuse.setdefault(nbytes, []).append(address)

    def stats(self) -> dict[str, Any]:
        return self.inner.stats() if self.inner is not None else {}

    def __getattr__(self, name: str) -> Any:
        """The tracker's optional hooks (`bind`, `op`: hpcmem.trace.events.EventLog) reach the inner listener."""
        if name in ("bind", "op") and self.__dict__.get("inner") is not None:
            return getattr(self.__dict__["inner"], name)
        raise AttributeError(name)

    # -- results -------------------------------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """The torch-snapshot dict: the event stream and the blocks alive at the end."""
        blocks: list[dict[str, Any]] = []
        cursor = BASE_ADDRESS
        for address, nbytes, frames, _ in sorted(self._live.values(), key=lambda v: v[0]):
            if address > cursor:
                blocks.append({"address": cursor, "size": address - cursor, "requested_size": 0,
                               "state": "inactive", "frames": []})
            blocks.append({"address": address, "size": nbytes, "requested_size": nbytes,
                           "state": "active_allocated", "frames": frames})
            cursor = address + nbytes
        total = max(self._top, cursor) - BASE_ADDRESS
        if cursor < BASE_ADDRESS + total:
            blocks.append({"address": cursor, "size": BASE_ADDRESS + total - cursor, "requested_size": 0,
                           "state": "inactive", "frames": []})
        live = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
        segment = {"device": 0, "address": BASE_ADDRESS, "total_size": total, "allocated_size": live,
                   "active_size": live, "requested_size": live, "stream": 0, "segment_type": "large",
                   "segment_pool_id": (0, 0), "is_expandable": False, "frames": [], "blocks": blocks}
        return {"segments": [segment] if total else [], "device_traces": [self.events],
                "allocator_settings": {"source": "hpcmem trace (fake tensors, CUDA mapping)"}}

    def peak_bytes(self) -> int:
        """The largest live total along the stream (what the trace reports as its peak, before any reset)."""
        return max(live_series(self.events), default=0)

    def write(self, path: str | Path) -> Path:
        path = Path(path)
        try:
            with path.open("wb") as fh:
                pickle.dump(self.snapshot(), fh, protocol=4)
        except OSError as exc:
            raise HpcmemError(f"cannot write the snapshot {path}: {exc.strerror or exc}") from None
        return path

    # -- helpers -------------------------------------------------------------------------------------------------
    def _event(self, action: str, address: int, nbytes: int, frames: list) -> None:
        self.events.append({"action": action, "addr": address, "size": nbytes, "stream": 0, "frames": frames,
                            "time_us": len(self.events)})
        self.phases.append(self._phase_now())     # where the event happens (a free's frames are its birth's)

    def _frames(self) -> list[dict[str, Any]]:
        out = [self._frame("hpcmem phase", 0, self._phase_now())]
        frame = sys._getframe(2)
        while frame is not None and len(out) < self.max_frames:
            code = frame.f_code
            if not code.co_filename.endswith(_SKIP_FILES):
                out.append(self._frame(code.co_filename, frame.f_lineno, code.co_name))
            frame = frame.f_back
        return out

    def _phase_now(self) -> str:
        phase = self.phase()
        if phase:
            self._stepped = self._stepped or phase.startswith("step ")
            return phase
        return TEARDOWN if self._stepped else SETUP

    def _frame(self, filename: str, line: int, name: str) -> dict[str, Any]:
        """One dict per distinct frame, shared by every event (pickle stores it once)."""
        key = (filename, line, name)
        hit = self._frame_cache.get(key)
        if hit is None:
            hit = self._frame_cache[key] = {"filename": filename, "line": line, "name": name}
        return hit


def live_series(events: list[dict[str, Any]]) -> list[int]:
    """Live bytes after each event of a torch-snapshot device trace (alloc adds, free_completed subtracts)."""
    out, live = [], 0
    for e in events:
        if e["action"] == "alloc":
            live += e["size"]
        elif e["action"] == "free_completed":
            live -= e["size"]
        out.append(live)
    return out

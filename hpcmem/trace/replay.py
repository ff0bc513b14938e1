"""Replay a recorded device stream (hpcmem.trace.events) through the caching-allocator model, adding what a CUDA
process allocates through the same allocator that no tensor holds.

Added (each once per CPU thread that runs cuBLAS: Python's and autograd's device thread, at that thread's first
GEMM, after the GEMM's output exists):
- the cuBLAS workspace: aten/src/ATen/cuda/CublasHandlePool.cpp `getCurrentCUDABlasHandle` → `setWorkspaceForHandle`
  allocates `getChosenWorkspaceSize()` (32 MiB on sm_90, 8.125 MiB elsewhere; hpcmem.estimate.workspaces) from the
  caching allocator, one per (handle, stream), kept for the life of the process;
- the cuBLASLt workspace, at the thread's first bias GEMM (addmm with a 1-D bias goes through cublasLt's
  `gemm_and_bias`): `getCUDABlasLtWorkspace` allocates `getCUDABlasLtWorkspaceSize()` — CUBLASLT_WORKSPACE_SIZE,
  default 1024 KiB — per (handle, stream), separate from cuBLAS's unless TORCH_CUBLASLT_UNIFIED_WORKSPACE=1.
  The cuBLASLt handle is the cuBLAS handle on CUDA builds, so the cuBLAS workspace is taken first.

The probe's reserved peak is the maximum over the steps after the first (hpcmem.probe.runner, warmup_steps=1);
`ReplayResult.steady_*` are the same maxima over the replayed steps ≥ 2.

`empty_cache_steps` (TrainingArguments.torch_empty_cache_steps): transformers' `Trainer.training_step`
(transformers/trainer.py, 5.24) calls `clear_device_cache()` → `torch.cuda.empty_cache()` after `compute_loss` and
before `accelerator.backward` whenever `state.global_step % torch_empty_cache_steps == 0` — once per micro-batch of
such a step; global_step is the number of finished optimizer steps, so traced step s (1-based) empties when
(s − 1) % k == 0. The replay empties where the stream enters a micro-batch's backward phase.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hpcmem.estimate.caching_allocator import CachingAllocator
from hpcmem.trace.events import AUTOGRAD_PHASE as BACKWARD
from hpcmem.trace.events import step_of

MIB = 1024**2
CUBLAS_WORKSPACE_BYTES = 32 * MIB       # sm_90 default (hpcmem.estimate.workspaces.HOPPER_BYTES)
CUBLASLT_WORKSPACE_BYTES = 1 * MIB      # CUBLASLT_WORKSPACE_SIZE default, 1024 KiB


@dataclass(frozen=True, kw_only=True)
class Workspaces:
    """Bytes cuBLAS and cuBLASLt take per thread; 0 leaves a workspace out (a trace of tensors alone)."""

    cublas: int = CUBLAS_WORKSPACE_BYTES
    cublaslt: int = CUBLASLT_WORKSPACE_BYTES


NO_WORKSPACES = Workspaces(cublas=0, cublaslt=0)


@dataclass
class ReplayResult:
    expandable: bool
    stats: dict[str, Any]
    step_peaks: dict[int, tuple[int, int]] = field(default_factory=dict)   # step -> (allocated, reserved) peaks
    workspace_bytes: int = 0
    steady_peak_index: int = -1     # the event at which steps ≥ 2 first reach their allocated peak (-1: none)
    allocator: CachingAllocator | None = field(default=None, repr=False, compare=False)   # its state at the end

    @property
    def steady_reserved_bytes(self) -> int:
        return steady_peak(self.step_peaks, 1)

    @property
    def steady_allocated_bytes(self) -> int:
        return steady_peak(self.step_peaks, 0)


def steady_peak(peaks: dict[int, tuple[int, int]], i: int) -> int:
    """The largest of steps ≥ 2 (the probe reads steps 2–3; step 1 creates the optimizer states), else of all; `i`:
    0 allocated, 1 reserved."""
    later = [v[i] for s, v in peaks.items() if s >= 2] or [v[i] for v in peaks.values()]
    return max(later) if later else 0


def replay(events: list[Any], *, expandable: bool = False, workspaces: Workspaces = Workspaces(),
           capacity_bytes: int | None = None, until: int | None = None,
           empty_cache_steps: int | None = None) -> ReplayResult:
    """Feed the stream to a fresh allocator model; per-step peaks of allocated (torch's count: whole blocks) and
    reserved bytes. `until`: stop before that event — the result's `allocator` is then the state there (e.g. at
    `steady_peak_index + 1`, the allocated peak's instant). `empty_cache_steps`: the Trainer's
    `torch_empty_cache_steps` (module docstring)."""
    alloc = CachingAllocator(expandable_segments=expandable, capacity_bytes=capacity_bytes)
    st = alloc.stats
    handles: dict[int, int] = {}
    taken: set[tuple[str, str]] = set()
    peaks: dict[int, tuple[int, int]] = {}
    step, a_peak, r_peak, extra, steady, at = 0, 0, 0, 0, 0, -1
    in_backward = False
    for i, ev in enumerate(events[:until]):
        if isinstance(ev, int):
            if ev >= 0:
                handles[i] = alloc.malloc(ev)
            else:
                alloc.free(handles.pop(i + ev))
        elif ev[0] == "phase":
            new = step_of(ev[1])
            if new != step and new:
                _close(peaks, step, a_peak, r_peak)
                step, a_peak, r_peak = new, st.allocated_bytes, st.reserved_bytes
            entering, in_backward = _enters_backward(ev[1], in_backward)
            if entering and empty_cache_steps and new and (new - 1) % empty_cache_steps == 0:
                alloc.empty_cache()
            continue
        elif ev[0] == "gemm":
            extra += _workspaces(alloc, taken, ev[1], ev[2], workspaces)
        a_peak = max(a_peak, st.allocated_bytes)
        r_peak = max(r_peak, st.reserved_bytes)
        if step >= 2 and st.allocated_bytes > steady:
            steady, at = st.allocated_bytes, i
    _close(peaks, step, a_peak, r_peak)
    return ReplayResult(expandable=expandable, stats=st.to_json(), step_peaks=peaks, workspace_bytes=extra,
                        steady_peak_index=at, allocator=alloc)


def _enters_backward(phase: str | None, was: bool) -> tuple[bool, bool]:
    """(does this phase marker enter a backward from outside one, is the stream in a backward now)."""
    now = bool(phase) and f"/ {BACKWARD}" in phase
    return now and not was, now


def _close(peaks: dict[int, tuple[int, int]], step: int, a_peak: int, r_peak: int) -> None:
    old = peaks.get(step, (0, 0))
    peaks[step] = (max(old[0], a_peak), max(old[1], r_peak))


def _workspaces(alloc: CachingAllocator, taken: set[tuple[str, str]], thread: str, kind: str,
                ws: Workspaces) -> int:
    """Take the thread's cuBLAS workspace (and its cuBLASLt one for a bias GEMM) the first time; never freed."""
    added = 0
    for name, nbytes in (("cublas", ws.cublas), ("cublaslt", ws.cublaslt if kind == "lt" else 0)):
        if nbytes and (thread, name) not in taken:
            taken.add((thread, name))
            alloc.malloc(nbytes)
            added += nbytes
    return added

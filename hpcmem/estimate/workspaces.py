"""cuBLAS workspaces: bytes PyTorch's caching allocator hands to cuBLAS, counted in `max_memory_allocated()` but held
by no tensor, so the trace never sees them.

Source: pytorch aten/src/ATen/cuda/CublasHandlePool.cpp, `parseChosenWorkspaceSize()`: without CUBLAS_WORKSPACE_CONFIG
the workspace is 4096 KiB × 8 = 32 MiB on compute capability 9.0 (Hopper) and 4096 KiB × 2 + 16 KiB × 8 elsewhere;
one is allocated per (cuBLAS handle, stream) and kept, and handles are per thread (a thread-local PoolWindow). A
training step multiplies matrices on two threads — Python's (forward, generation) and autograd's device thread
(backward) — so two workspaces are live from the first backward on, in every later phase.

Measured: on the H200 records of 2026-11-29 (estimator/probes/nvidia-h200.jsonl) the optimizer phase held 64.2 MiB
more than the weights, gradients and optimizer states for every Llama, Mistral, Phi-3 and Qwen3-MoE run (2 × 32 MiB
plus 0.2 MiB); Qwen2.5 and Gemma-3 runs held 10–50 MiB more again (not modelled: bias GEMMs through cuBLASLt are a
lead, not a finding).
"""

from __future__ import annotations

from hpcmem.spec import GpuSpec

NAME = "cuBLAS workspaces"
HANDLES = 2                                   # Python's thread + autograd's device thread
KIB = 1024
HOPPER_BYTES = 4096 * KIB * 8                 # sm_90 default: 32 MiB
OTHER_BYTES = 4096 * KIB * 2 + 16 * KIB * 8   # every other capability: 8.125 MiB


def workspace_bytes(gpu: GpuSpec | None) -> int:
    """Bytes of one cuBLAS workspace on this GPU; with no GPU named, Hopper's (the larger, so the safer)."""
    if gpu is None or gpu.compute_capability in ("", "9.0"):
        return HOPPER_BYTES
    return OTHER_BYTES


def cublas_workspaces(gpu: GpuSpec | None) -> tuple[int, str]:
    """Bytes of the workspaces a training process keeps, and the note that says where they come from."""
    per = workspace_bytes(gpu)
    where = "no --gpu: Hopper's size assumed" if gpu is None else f"compute capability {gpu.compute_capability or '?'}"
    return HANDLES * per, f"{HANDLES} × {per / KIB**2:g} MiB (one per thread that runs cuBLAS; {where})"


def tensor_bytes(phase) -> int:
    """A phase's bytes without the workspaces: what a trace of tensors can be compared with."""
    return phase.bytes - sum(c.bytes for c in phase.components if c.name == NAME)

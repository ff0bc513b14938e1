"""cuBLAS workspaces: bytes PyTorch's caching allocator hands to cuBLAS, counted in `max_memory_allocated()` but held
by no tensor, so the trace never sees them.

Source: pytorch aten/src/ATen/cuda/CublasHandlePool.cpp, `parseChosenWorkspaceSize()`: without CUBLAS_WORKSPACE_CONFIG
the workspace is 4096 KiB × 8 = 32 MiB on compute capability major 9, 10 and 12 (Hopper, Blackwell) and 4096 KiB × 2 +
16 KiB × 8 elsewhere; with it, Σ SIZE KiB × COUNT over its `:SIZE:COUNT` pairs (hpcmem.job.job_env);
one is allocated per (cuBLAS handle, stream) and kept, and handles are per thread (a thread-local PoolWindow). A
training step multiplies matrices on two threads — Python's (forward, generation) and autograd's device thread
(backward) — so two workspaces are live from the first backward on, in every later phase.

A model with biased linears (Qwen2.5's q/k/v) also takes a cuBLASLt workspace: addmm with a 1-D bias goes through
`gemm_and_bias` (aten/src/ATen/native/cuda/Blas.cpp `addmm_out_cuda_impl`), which allocates
`getCUDABlasLtWorkspaceSize()` (CUBLASLT_WORKSPACE_SIZE, default 1024 KiB; CublasHandlePool.cpp
`getCUDABlasLtWorkspace`) per (handle, stream), separate from cuBLAS's unless TORCH_CUBLASLT_UNIFIED_WORKSPACE=1. The
forward runs it on Python's thread; with gradient checkpointing the recompute runs it again on autograd's thread.
The trace replay takes the same workspaces (hpcmem.trace.replay). Checked against the H200 probe records:
estimator/LOG.md.
"""

from __future__ import annotations

from hpcmem.estimate.names import BLOCK_TAILS as TAILS
from hpcmem.estimate.names import CUBLAS_WORKSPACES
from hpcmem.gpus.spec import GpuSpec
from hpcmem.models.params import linear_modules

HANDLES = 2                                   # Python's thread + autograd's device thread
KIB = 1024
HOPPER_BYTES = 4096 * KIB * 8                 # default on majors 9, 10, 12: 32 MiB
LARGE_DEFAULT_MAJORS = ("9", "10", "12")      # `use32mb` in parseChosenWorkspaceSize
OTHER_BYTES = 4096 * KIB * 2 + 16 * KIB * 8   # every other capability: 8.125 MiB
CUBLASLT_BYTES = 1024 * KIB                   # CUBLASLT_WORKSPACE_SIZE default


def workspace_bytes(gpu: GpuSpec | None, configured: int | None = None) -> int:
    """Bytes of one cuBLAS workspace on this GPU (`configured`: CUBLAS_WORKSPACE_CONFIG's, which replaces the
    default); with no GPU named, Hopper's (the larger, so the safer)."""
    if configured is not None:
        return configured
    if gpu is None or gpu.compute_capability.split(".")[0] in ("", *LARGE_DEFAULT_MAJORS):
        return HOPPER_BYTES
    return OTHER_BYTES


def cublas_workspaces(gpu: GpuSpec | None, lt_threads: int = 0, configured: int | None = None) -> tuple[int, str]:
    """Bytes of the workspaces a training process keeps, and the note that says where they come from; `lt_threads`:
    how many threads run a bias GEMM (`cublaslt_threads`); `configured`: CUBLAS_WORKSPACE_CONFIG's workspace."""
    per = workspace_bytes(gpu, configured)
    where = "no --gpu: Hopper's size assumed" if gpu is None else f"compute capability {gpu.compute_capability or '?'}"
    if configured is not None:
        where = "CUBLAS_WORKSPACE_CONFIG"
    note = f"{HANDLES} × {per / KIB**2:g} MiB (one per thread that runs cuBLAS; {where})"
    if lt_threads:
        note += f" + {lt_threads} × 1 MiB cuBLASLt (bias GEMMs)"
    return HANDLES * per + lt_threads * CUBLASLT_BYTES, note


def cublaslt_threads(job) -> int:
    """Threads that run a bias GEMM: none without biased linears; the forward's, and autograd's when checkpointing
    recomputes the forward inside the backward."""
    if not any(mod.bias for mod in linear_modules(job.model)):
        return 0
    return 2 if job.train.gradient_checkpointing else 1


def tensor_bytes(phase) -> int:
    """A phase's bytes without what no tensor holds — the workspaces and the allocator's block tails
    (hpcmem.estimate.tails): what a trace of tensors can be compared with."""
    return phase.bytes - sum(c.bytes for c in phase.components if c.name in (CUBLAS_WORKSPACES, TAILS))

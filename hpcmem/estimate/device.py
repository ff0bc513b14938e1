"""What a GPU spends outside PyTorch's live tensors: allocator slack (reserved − allocated) and the device level
(CUDA context, libraries, NCCL). Every constant is named, says where it comes from, and yields to probe calibration
(hpcmem validate --against probes) when records exist for the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcmem.spec import JobSpec

MIB = 1024**2
# Defaults for a GPU without its own calibration. Context: everything outside PyTorch's allocator (CUDA context,
# loaded kernels, library handles), measured as device − reserved on the H200 records of 2026-11-29 (driver 580.159,
# torch 2.11 + CUDA 13.0): 1,381–1,408 MiB over 20 runs, median 1,382 MiB (estimator/calibration/h200.json). It was a
# 600 MiB guess from MEMORY-FACTS.md's 0.3–2 GiB range, which read every small job 20–33 % under at the device level.
# Other GPUs, drivers and CUDA versions differ: their own probe records replace this. NCCL: per process group.
DEFAULT_CONTEXT_BYTES = 1382 * MIB
DEFAULT_NCCL_BYTES = 400 * MIB             # one NCCL communicator's buffers (world > 1)
# Caching allocator (c10/cuda/CUDACachingAllocator.cpp): requests come from 2 MiB / 20 MiB / 2 MiB-rounded segments,
# freed blocks stay reserved, tensors of different lifetimes fragment the segments. Slack = fraction × the peak
# allocated bytes, fitted to hpcmem's model of that allocator (hpcmem/trace/allocator.py) replaying the traces of the
# 45 CI cases (`python -m hpcmem.bench.allocator_sim --cases estimator/cases/*.yaml --per-file 100 --save F`;
# rows and fit in estimator/allocator-sim.json): the median (reserved − allocated) / allocated of the even-indexed
# half. On the held-out half the reserved peak is then off by a median 3.2 % (p90 5.2 %) by default and 1.7 % (p90
# 4.0 %) with expandable_segments, against 6.1 % / 2.9 % for the former guess (10 % / 2 % of the transient bytes,
# which under-estimated 20 of 22). A model of the allocator, not a GPU measurement: probe records replace it.
FRAGMENTATION_FRACTION = 0.050
EXPANDABLE_FRACTION = 0.024


@dataclass(frozen=True, kw_only=True)
class DeviceTerms:
    reserved_extra: int
    device_extra: int
    note: str
    calibrated: bool


def device_terms(job: JobSpec, peak_allocated_bytes: int, vllm_bytes: int = 0) -> DeviceTerms:
    fraction = EXPANDABLE_FRACTION if job.expandable_segments else FRAGMENTATION_FRACTION
    reserved_extra = int(fraction * peak_allocated_bytes)
    gpu = job.gpu
    calibrated = bool(gpu and gpu.calibrated)
    context = gpu.context_bytes if calibrated else DEFAULT_CONTEXT_BYTES
    nccl = DEFAULT_NCCL_BYTES if job.parallel.world_size > 1 else 0
    parts = [f"context {context / MIB:.0f} MiB" + ("" if calibrated else " (uncalibrated)")]
    if nccl:
        parts.append(f"NCCL {nccl / MIB:.0f} MiB")
    if vllm_bytes:
        parts.append(f"vLLM pool {vllm_bytes / 1024**3:.1f} GiB")
    return DeviceTerms(reserved_extra=reserved_extra, device_extra=context + nccl + vllm_bytes,
                       note=", ".join(parts), calibrated=calibrated)

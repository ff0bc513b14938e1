"""The device level: device peak = reserved + what PyTorch's caching allocator does not hold, term by term.

Named terms (`DeviceTerm`), each with where its number comes from:
- **CUDA context** (per GPU, per process): the CUDA context, the kernels loaded into it (lazy module loading grows it
  as new kernels run) and the memory cuBLAS/cuDNN handles keep outside the allocator. Measured as device − reserved
  at the peak; calibrated per GPU model and driver from probe records (estimator/calibration/<gpu>.json,
  `hpcmem validate probes --fit`). A calibrated value is NVML's device used − reserved, so it also holds what the
  driver reserves on the board before any process runs (NVML counts it as used; torch's total already leaves it out),
  and the verdict, which holds the device peak against torch's total, is that much stricter on a calibrated GPU
  (H200: 615 MiB, 0.4 % of its capacity).
  Uncalibrated default: the process's own part on the H200 — NVML used − reserved − NVML used before the process
  made its context, median over the H200 probe records (estimator/probes/nvidia-h200.jsonl: 1,382 − 618 MiB), so a
  GPU without its own records borrows the H200's context, not the H200 board's reserve. Borrowed, flagged
  "uncalibrated": the context depends on the architecture, the driver and the kernels a job loads. Published contexts
  right after torch's CUDA init with lazy module loading are smaller (about 300-400 MiB: pytorch/pytorch#107667,
  #109888; 256 MiB on an RTX 3090, invoke-ai/InvokeAI#9413) but hold none of the kernels a training step loads, and
  Answer.AI's RTX 4090 Yi-34B row leaves at most 0.47 GiB for context and NCCL together
  (estimator/published/answerai-fsdp-qlora.yaml): on consumer cards the borrowed value is likely high.
- **cuBLAS / cuBLASLt workspaces**: allocated *through* the caching allocator (CublasHandlePool.cpp), so they are
  part of allocated and reserved already (hpcmem/estimate/workspaces.py); named here, never added twice.
- **NCCL** (world > 1): each communicator's channel buffers and proxy state, outside the allocator (cudaMalloc /
  cuMem). One process group per data-parallel job; uncalibrated constant until multi-GPU probe records exist
  (it depends on the world size, the topology, NCCL_BUFFSIZE and NVLS). Only a multi-GPU run measures it. Between
  GPUs without peer access (GeForce cards over PCIe) NCCL's SHM transport keeps the channel buffers in host shared
  memory mapped to the device (nccl src/transport/shm.cc `shmRecvSetup`), so there the constant overstates; it is
  not split by transport until a run measures what stays on the device.
- **NCCL NVLS** (more than two GPUs of the job on one NVSwitch node that does NVLink SHARP: H100 SXM, H200, B200):
  the multicast buffers NCCL maps with cuMemCreate beside the channel buffers, sized from NCCL's code
  (hpcmem.estimate.nccl: 256 MiB on 8 Hopper GPUs with torch 2.13's NCCL; 1.5–2.3 GiB with the NCCL 2.18–2.20 of
  torch 2.1–2.4). NCCL_NVLS_ENABLE=0 removes it.
- **vLLM pool** (colocate mode): vLLM preallocates `vllm_gpu_memory_utilization` × device memory for weights and KV
  cache through its own allocator (documented rule, not traced); sleep mode releases it while training.

Reserved − allocated (the allocator's own slack) is hpcmem.estimate.allocator's, not a device term.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcmem.estimate.nccl import NCCL_OF_TORCH, job_nvls_bytes
from hpcmem.gpus.spec import GpuSpec
from hpcmem.job.jobspec import JobSpec

MIB = 1024**2
DEFAULT_CONTEXT_BYTES = 764 * MIB          # uncalibrated default: the H200's process context (see above)
DEFAULT_NCCL_BYTES = 400 * MIB             # one NCCL communicator's buffers (world > 1), uncalibrated
NVLS_SOURCE = f"NCCL {NCCL_OF_TORCH[0]}.{NCCL_OF_TORCH[1]}'s NVLS buffers, from its code"


@dataclass(frozen=True, kw_only=True)
class DeviceTerm:
    """Bytes one GPU holds outside PyTorch's allocator for one reason."""

    name: str
    bytes: int
    source: str              # where the number comes from
    calibrated: bool         # measured on this GPU model (probe records) rather than a default or a rule


@dataclass(frozen=True, kw_only=True)
class DeviceTerms:
    reserved_extra: int      # allocator slack (reserved − allocated), from hpcmem.estimate.allocator
    terms: tuple[DeviceTerm, ...]
    calibrated: bool         # the context is this GPU's own calibration

    @property
    def device_extra(self) -> int:
        return sum(t.bytes for t in self.terms)

    @property
    def note(self) -> str:
        parts = []
        for t in self.terms:
            if not t.bytes:
                continue
            size = f"{t.bytes / 1024**3:.1f} GiB" if t.bytes >= 10 * 1024**3 else f"{t.bytes / MIB:.0f} MiB"
            parts.append(f"{t.name} {size}" + ("" if t.calibrated else f" ({t.source})"))
        return ", ".join(parts)


def device_terms(job: JobSpec, reserved_extra: int, vllm_bytes: int = 0) -> DeviceTerms:
    gpu = job.gpu
    calibrated = bool(gpu and gpu.calibrated)
    context = DeviceTerm(name="context", bytes=gpu.context_bytes if calibrated else DEFAULT_CONTEXT_BYTES,
                         source="probe calibration" if calibrated else "uncalibrated: the H200's, borrowed",
                         calibrated=calibrated)
    terms = [context]
    if job.parallel.world_size > 1:
        terms.append(DeviceTerm(name="NCCL", bytes=DEFAULT_NCCL_BYTES, source="uncalibrated", calibrated=False))
        nvls = job_nvls_bytes(job)
        if nvls:
            terms.append(DeviceTerm(name="NCCL NVLS", bytes=nvls, source=NVLS_SOURCE, calibrated=False))
    if vllm_bytes:
        terms.append(DeviceTerm(name="vLLM pool", bytes=vllm_bytes, source="vllm_gpu_memory_utilization × memory",
                                calibrated=False))
    return DeviceTerms(reserved_extra=reserved_extra, terms=tuple(terms), calibrated=calibrated)


def board_reserve_seen_by_nvml(gpu: GpuSpec | None) -> int:
    """What a whole-GPU reading (nvidia-smi, NVML, a GPU memory graph) shows above this estimate's device peak: the
    memory the driver reserves on the board, NVML total − torch's total (gpus.json memory_bytes − capacity_bytes),
    for a GPU whose context is not its own calibration; 0 for a calibrated one, whose context was measured with NVML
    and holds it (module docstring). Where gpus.json derives the capacity (capacity_derived), this is derived too."""
    if gpu is None or gpu.calibrated or not gpu.capacity_bytes:
        return 0
    return max(0, gpu.memory_bytes - gpu.capacity_bytes)

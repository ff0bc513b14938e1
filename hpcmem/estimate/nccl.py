"""NCCL's NVLS buffers: the device memory one communicator takes for NVLink SHARP on an NVSwitch board.

On a node whose GPUs sit on NVSwitches that do NVLink SHARP (HGX/DGX H100, H200, B200: `nvls` in hpcmem/gpus.json)
NCCL turns NVLS on for a communicator with more than two GPUs on the node (`ncclNvlsInit`: `gpuCount <= 2` returns
with NVLS off; NCCL_NVLS_ENABLE=0 turns it off) and maps one physical buffer per GPU with cuMemCreate — outside
PyTorch's allocator, so it is in NVML's "used" (the device peak) and in no torch statistic. Its size, from NCCL's
src/transport/nvls.cc (NVIDIA/nccl at the release tags below), is

    nvlsTotalSize = nChannels × 2 × (buffSize + memSize) × nHeads

with nHeads the node's GPUs in the communicator, and per release:

| NCCL | nChannels | buffSize | memSize | 8 GPUs, sm90 |
|---|---|---|---|---|
| 2.18, 2.19 | nvlsChannels = NCCL_NVLS_NCHANNELS, 16 | the SIMPLE buffer, NCCL_BUFFSIZE = 4 MiB | 2 MiB | 1,536 MiB |
| 2.20 | comm->nChannels, 24 on 8 NVSwitch GPUs | 4 MiB | 2 MiB | 2,304 MiB |
| 2.21 | comm->nChannels, 24 | NCCL_NVLS_CHUNKSIZE 128 KiB × NCCL_STEPS 8 = 1 MiB | 2 MiB | 1,152 MiB |
| 2.22 on | nvlsChannels: 16 (sm90); from 2.28 on sm100, 24 on one node, 32 across nodes | 1 MiB | none | 256 MiB |

(2.20: `int nChannels = comm->nChannels`; the 24 channels of 8 NVSwitch GPUs are read off NCCL's own INFO line on 8
H200s, "NVLS comm … nHeads 8 buffSize 4194304 memSize 2097152 nvlsPerRankSize 301989888 nvlsTotalSize 2415919104",
vllm-project/vllm#9699 with NCCL 2.20.5 — 288 MiB = 24 × 2 × 6 MiB per head. 2.22 and later: `ncclNvlsBufferSetup`,
`nvlsPerRankSize = nChannels * 2 * buffSize`; `NVLS_NCHANNELS_SM90 16`, `NVLS_NCHANNELS_SM100_NVL 24`,
`NVLS_NCHANNELS_SM100 32` in 2.28.) The size is rounded up to the allocation granularity (2 MiB). From 2.22 NCCL
connects algorithms when a collective first needs them (NCCL_RUNTIME_CONNECT), so the buffer appears at the first
collective NCCL runs over NVLS, which a training step's all-reduce or reduce-scatter is; before, at init.

An estimate models torch 2.13's NCCL (2.29.3 in its CUDA 12.6 wheels, 2.29.7 in the CUDA 13 ones: pytorch/pytorch
RELEASE.md, #190386) and one data-parallel communicator. Not counted: the ring/tree channel buffers (the flat NCCL term
of hpcmem.estimate.device), a second process group (HSDP's or a parallelism layout's own groups take their own),
and a multi-node NVLink domain (GB200 NVL72), where NVLS spans the racks' GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcmem.gpus.spec import GpuSpec
from hpcmem.job.jobspec import JobSpec

MIB = 1024**2
GRANULARITY = 2 * MIB               # cuMemGetAllocationGranularity's recommended size on these boards
NCCL_OF_TORCH = (2, 29)             # torch 2.13's NCCL (module docstring)


@dataclass(frozen=True)
class NvlsLayout:
    """One NCCL release's NVLS buffer: channels, SIMPLE bytes per channel and direction, and the extra region."""

    channels: int
    buff: int
    mem: int


def layout(version: tuple[int, int], compute_capability: str, multi_node: bool) -> NvlsLayout:
    """The NVLS layout of an NCCL release (module docstring's table) on a GPU of this compute capability."""
    if version < (2, 18):
        raise ValueError(f"NCCL {version[0]}.{version[1]}: NVLS buffers are known from 2.18 on")
    if version < (2, 20):
        return NvlsLayout(channels=16, buff=4 * MIB, mem=2 * MIB)
    if version < (2, 21):
        return NvlsLayout(channels=24, buff=4 * MIB, mem=2 * MIB)
    if version < (2, 22):
        return NvlsLayout(channels=24, buff=1 * MIB, mem=2 * MIB)
    blackwell = version >= (2, 28) and _major(compute_capability) >= 10
    return NvlsLayout(channels=(32 if multi_node else 24) if blackwell else 16, buff=1 * MIB, mem=0)


def nvls_bytes(gpu: GpuSpec | None, gpus_on_node: int, num_machines: int = 1,
               version: tuple[int, int] = NCCL_OF_TORCH) -> int:
    """Bytes one GPU maps for NCCL's NVLS buffers: 0 unless the GPU is on an NVLS board and more than two of the
    communicator's GPUs share its node."""
    if gpu is None or not gpu.nvls or gpus_on_node <= 2:
        return 0
    lay = layout(version, gpu.compute_capability, num_machines > 1)
    size = lay.channels * 2 * (lay.buff + lay.mem) * gpus_on_node
    return -(-size // GRANULARITY) * GRANULARITY


def job_nvls_bytes(job: JobSpec, version: tuple[int, int] = NCCL_OF_TORCH) -> int:
    """`nvls_bytes` for a job's GPU and its data-parallel communicator: its processes per node, its nodes; none
    where the job's environment sets NCCL_NVLS_ENABLE=0 (hpcmem.job.job_env)."""
    par = job.parallel
    if not job.env.nvls:
        return 0
    return nvls_bytes(job.gpu, par.num_processes // max(par.num_machines, 1), par.num_machines, version)


def parse_version(text: str) -> tuple[int, int]:
    """'2.19' or '2.19.3' → (2, 19); ValueError names the rule."""
    parts = str(text).strip().split(".")
    if len(parts) < 2 or not all(p.isdigit() for p in parts[:3]):
        raise ValueError(f"NCCL version {text!r}: major.minor[.patch], e.g. 2.19 or 2.21.5")
    return int(parts[0]), int(parts[1])


def _major(compute_capability: str) -> int:
    head = compute_capability.split(".")[0]
    return int(head) if head.isdigit() else 0

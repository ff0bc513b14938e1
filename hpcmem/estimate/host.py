"""Host RAM of the whole job, per rank and per node: loading the model, training, saving a checkpoint.

How TRL 1.16 / transformers 5.24 / accelerate 1.15 / DeepSpeed 0.19 place bytes in host RAM, phase by phase:
- model loading: TRL's trainers load the model with `device_map=None` under MULTI_GPU and DEEPSPEED (sft_trainer.py,
  dpo_trainer.py, grpo_trainer.py: "Distributed training requires device_map=None"), so every rank holds a full copy
  in the load dtype (fp32 unless dtype is set) on the CPU until the Trainer / DeepSpeed moves it to its GPU, the
  reference model too. One GPU (`distributed_type` NO) gets `device_map="auto"` (trl/trainer/utils.py
  `create_model_from_path`): the weights go straight to the GPU. ZeRO-3 with zero3_init_flag loads under `zero.Init`,
  which partitions every weight as it is created (transformers modeling_utils.py `is_deepspeed_zero3_enabled`). FSDP
  with cpu_ram_efficient_loading loads on local rank 0 only, the others build on the meta device (transformers
  modeling_utils.py `is_fsdp_enabled` / `is_local_dist_rank_0`); without it every rank loads. 4/8-bit bases are
  quantized onto the GPU by bitsandbytes as they load. The checkpoint files themselves are memory-mapped page cache
  (reclaimable), not counted.
- training: CPU offload (ZeRO optimizer states with their fp32 gradient partition, ZeRO-3 parameter partitions, FSDP's
  sharded parameters, gradients and optimizer states — pinned buffers; estimate/states.py) and activation offloading
  (pinned; estimate/step.py).
- checkpoint save: the offloaded states stay; the save adds its host copies (estimate/checkpoint.py).
Every rank also holds the process baseline (interpreter, torch, CUDA libraries); each dataloader worker is a process
of its own. Per node: the rank that writes checkpoints (and, under FSDP's efficient loading, loads the model) plus
the node's other ranks, in the same phase, plus their workers.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcmem.estimate.breakdown import Component, HostEstimate, HostPhase
from hpcmem.estimate.checkpoint import SaveBytes
from hpcmem.estimate.names import PROCESS_BASELINE
from hpcmem.estimate.states import ParamParts, States
from hpcmem.estimate.trainers import has_reference
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.trainers import entry

GIB = 1024**3
MIB = 1024**2
# Peak resident set (VmHWM) of a CUDA training process that has not loaded weights on the CPU: medians of the
# single-GPU probe records, without and with generation (GRPO/RLOO import and buffer more); see estimator/LOG.md.
PROCESS_BASELINE_BYTES = 1797 * MIB
GENERATION_BASELINE_BYTES = 2350 * MIB
# A dataloader worker is a forked process; it shares the parent's pages until it writes them (copy on write). A guess,
# not a measurement: labelled uncalibrated wherever it is used.
DATALOADER_WORKER_BYTES = 512 * MIB

LOADING, TRAINING, SAVING = "model loading", "training", "checkpoint save"


def baseline(job: JobSpec) -> Component:
    generating = entry(job.train.trainer).generates
    return Component(name=PROCESS_BASELINE, bytes=GENERATION_BASELINE_BYTES if generating else
                     PROCESS_BASELINE_BYTES, note="interpreter, torch, CUDA libraries (1 H200, uncalibrated elsewhere)")


def loading(job: JobSpec, parts: ParamParts) -> tuple[tuple[Component, ...], tuple[Component, ...], str]:
    """(rank 0's, other ranks', why) model bytes on the CPU while the trainer builds the model."""
    t, par = job.train, job.parallel
    models = parts.total * (2 if has_reference(job) else 1)
    full = (Component(name="model on CPU", bytes=models * job.weight_bytes,
                      note=f"{job.load_dtype} load" + (" + reference model" if has_reference(job) else "")),)
    if t.quantized:
        return (), (), "4/8-bit base quantized onto the GPU while loading"
    if par.deepspeed and par.zero_stage == 3 and par.zero3_init_flag:
        return (), (), "zero.Init partitions the weights while loading"
    if par.fsdp and par.fsdp_cpu_ram_efficient_loading:
        return full, (), "cpu_ram_efficient_loading: local rank 0 loads, the others start on the meta device"
    if par.world_size == 1 and par.distributed_type == "NO":
        return (), (), "one GPU: TRL loads with device_map='auto', straight onto the GPU"
    return full, full, "every rank loads a full copy (device_map=None)"


def host_estimate(job: JobSpec, parts: ParamParts, states: States, offloaded_activations: int,
                  save: SaveBytes) -> HostEstimate:
    par, t = job.parallel, job.train
    base = baseline(job)
    offload = []
    if states.host:
        offload.append(Component(name="offloaded states", bytes=states.host, note="pinned"))
    if offloaded_activations:
        offload.append(Component(name="offloaded activations", bytes=offloaded_activations, note="pinned"))
    rank0_load, other_load, load_note = loading(job, parts)
    phases = (
        HostPhase(name=LOADING, rank0=(base, *rank0_load), other=(base, *other_load)),
        HostPhase(name=TRAINING, rank0=(base, *offload), other=(base, *offload)),
        HostPhase(name=SAVING, rank0=(base, *offload, *save.host_rank0), other=(base, *offload, *save.host_other)),
    )
    g = par.gpus_per_machine
    workers = Component(name="dataloader workers", bytes=g * t.dataloader_num_workers * DATALOADER_WORKER_BYTES,
                        note=f"{g} ranks × {t.dataloader_num_workers} workers (uncalibrated)")
    return HostEstimate(ranks_per_node=g, phases=phases, workers=workers,
                        offloaded_bytes=states.host + offloaded_activations, notes=(load_note,))


def fixed_node_bytes(host: HostEstimate) -> int:
    """Host bytes of a node that no memory technique changes: every rank's process baseline and the dataloader
    workers. A planner can stop at once when this alone exceeds the node's memory."""
    first = host.phases[0]
    base = next((c.bytes for c in first.other if c.name == PROCESS_BASELINE), 0)
    return host.ranks_per_node * base + host.workers.bytes


@dataclass(frozen=True, kw_only=True)
class HostCheck:
    fits: bool
    need_bytes: int
    capacity_bytes: int
    phase: str

    def message(self, where: str = "") -> str:
        verdict = "fits" if self.fits else "does not fit"
        return (f"host RAM {verdict}: {self.need_bytes / GIB:.1f} GiB per node at {self.phase} vs "
                f"{self.capacity_bytes / GIB:.1f} GiB{(' ' + where) if where else ''}")


def check_host(host: HostEstimate, memory_per_node_bytes: int) -> HostCheck:
    """The node's host RAM against what the scheduler grants it (SLURM --mem per node)."""
    return HostCheck(fits=host.per_node_bytes <= memory_per_node_bytes, need_bytes=host.per_node_bytes,
                     capacity_bytes=memory_per_node_bytes, phase=host.peak_phase.name)

"""Checkpoint saving as a phase of the job: what one save adds on each GPU and in each rank's host RAM.

TRL's scripts always end with `trainer.save_model(output_dir)` (trl/scripts/sft.py), and with `save_strategy` other
than "no" every checkpoint also saves the optimizer (`Trainer._save_checkpoint` → `_save_optimizer_and_scheduler`,
skipped with `save_only_model`). What happens per layout (transformers 5.24 trainer.py `save_model`, accelerate 1.15
`get_state_dict`, `save_fsdp_model`, `save_fsdp_optimizer`, DeepSpeed 0.19 engine.py):
- one GPU / DDP: rank 0 `save_pretrained` → safetensors copies each tensor of a shard to the host and keeps the copies
  until the shard is written (safetensors/torch.py `_flatten_as_ptr`, shards up to max_shard_size "50GB"); PEFT saves
  the adapters only. The optimizer goes through `torch.save` on rank 0.
- ZeRO-1/2: `get_state_dict` clones the whole 16-bit state dict to the host on EVERY rank
  (deepspeed/checkpoint/utils.py `clone_tensors_for_torch_save`; a PEFT model's state dict holds the base too);
  `save_checkpoint` then has each rank `torch.save` its fp32 partition and Adam states.
- ZeRO-3 with zero3_save_16bit_model (stage3_gather_16bit_weights_on_model_save): `_zero3_consolidated_16bit_state_dict`
  gathers one module's parameters at a time on every GPU (fetched parameters stay resident up to
  stage3_max_live_parameters) and copies them to rank 0's host: rank 0 ends up with the whole 16-bit model (PEFT: the
  adapters only, yet every module is still gathered). Without it, only `save_checkpoint` runs.
- FSDP2 FULL_STATE_DICT: `get_model_state_dict(full_state_dict, cpu_offload)` all-gathers one parameter at a time
  (in its sharded dtype) and keeps it on rank 0's host: the whole model there; the optimizer's full state dict the same
  way (Adam states of every trainable parameter). SHARDED_STATE_DICT: `torch.distributed.checkpoint` writes each
  rank's shards; nothing is gathered.
- `torch.save` of GPU tensors copies one storage at a time to the host (torch/serialization.py `_save`): a transient
  of the largest storage, counted once.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcmem.estimate.breakdown import Component
from hpcmem.estimate.lora import LoraLayout
from hpcmem.estimate.states import ParamParts, States
from hpcmem.estimate.zero_buckets import zero_buckets
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import Precision

MAX_SHARD_BYTES = 50 * 10**9          # transformers save_pretrained max_shard_size "50GB" (modeling_utils.py)
ZERO3_SUB_GROUP = 10**9               # sub_group_size hpcmem writes (launch/configs.py): fp32 flat groups per rank


@dataclass(frozen=True, kw_only=True)
class SaveBytes:
    """One save step (the model, or the optimizer): what it adds on each GPU and in host RAM per rank."""

    gpu: tuple[Component, ...] = ()          # transient on every GPU, beside the resident states
    host_rank0: tuple[Component, ...] = ()   # host RAM of the rank that writes the files
    host_other: tuple[Component, ...] = ()   # host RAM of every other rank


def _total(comps: tuple[Component, ...]) -> int:
    return sum(c.bytes for c in comps)


def worst(steps: list[SaveBytes]) -> SaveBytes:
    """Model and optimizer are saved one after the other (each step's copies are freed before the next): per place,
    the worse step counts."""
    def pick(attr: str) -> tuple[Component, ...]:
        return max((getattr(s, attr) for s in steps), key=_total, default=())

    return SaveBytes(gpu=pick("gpu"), host_rank0=pick("host_rank0"), host_other=pick("host_other"))


def _model_step(job: JobSpec, parts: ParamParts, prec: Precision, lora: LoraLayout, states: States) -> SaveBytes:
    par = job.parallel
    adapters = lora.num_params * lora.adapter_bytes
    if par.deepspeed and par.zero_stage == 3:
        if not par.zero3_save_16bit_model:
            return SaveBytes()
        # DeepSpeed gathers module by module, but what it fetched stays resident up to stage3_max_live_parameters:
        # on 2 CPU ranks every rank held the whole 16-bit model (less persistent parameters) while saving
        # (estimator/LOG.md); at least the largest module, at most max_live parameters
        live = max(parts.largest_module, min(parts.total + lora.num_params, zero_buckets(job).max_live))
        return SaveBytes(
            gpu=(Component(name="gathered parameters (16-bit save)", bytes=live * 2,
                           note="fetched modules stay up to stage3_max_live_parameters, every rank"),),
            host_rank0=(Component(name="16-bit state dict", bytes=(lora.num_params if lora.enabled else parts.total)
                                  * 2, note="consolidated on rank 0's host"),))
    if par.deepspeed:
        clone = (Component(name="16-bit state dict clone", bytes=(parts.total + lora.num_params) * 2,
                           note="clone_tensors_for_torch_save on every rank"),)
        return SaveBytes(host_rank0=clone, host_other=clone)
    if par.fsdp:
        if par.fsdp_state_dict_type != "FULL_STATE_DICT":
            return SaveBytes()
        return SaveBytes(
            gpu=(Component(name="gathered parameter (full state dict)", bytes=parts.largest_tensor * prec.weight,
                           note="one parameter at a time"),),
            host_rank0=(Component(name="full state dict", bytes=parts.total * prec.weight + adapters,
                                  note="on rank 0's host"),))
    written = adapters if lora.enabled else min(states.weights + states.quant_constants, MAX_SHARD_BYTES)
    return SaveBytes(host_rank0=(Component(name="safetensors shard copy", bytes=written,
                                           note="host copies of one shard (max_shard_size 50GB)"),))


def _optimizer_step(job: JobSpec, parts: ParamParts, prec: Precision, lora: LoraLayout) -> SaveBytes:
    par, n = job.parallel, job.parallel.layout.state_shards
    trainable = lora.num_params if lora.enabled else parts.total
    largest = max((r * c for r, c, _ in lora.matrices()), default=0) if lora.enabled else parts.largest_tensor
    if par.fsdp and par.fsdp_state_dict_type == "FULL_STATE_DICT":
        return SaveBytes(
            gpu=(Component(name="gathered optimizer state", bytes=largest * 4, note="one Adam state at a time"),),
            host_rank0=(Component(name="full optimizer state dict", bytes=trainable * 2 * 4,
                                  note="fp32 Adam states on rank 0's host"),))
    if par.deepspeed and par.zero_stage == 3:
        storage = min(-(-trainable // n), ZERO3_SUB_GROUP) * 4        # fp32 flat partition of one sub-group
    elif par.deepspeed:
        storage = -(-trainable // n) * 4                              # the fp32 flat partition of a param group
    elif par.fsdp:
        storage = -(-largest // n) * 4                                # one local shard (torch.distributed.checkpoint)
    else:
        storage = largest * (lora.adapter_bytes if lora.enabled else prec.weight)   # torch AdamW: param dtype
    copy = (Component(name="optimizer save (largest storage)", bytes=storage, note="torch.save's host copy"),)
    return SaveBytes(host_rank0=copy, host_other=copy if (par.deepspeed or par.fsdp) else ())


def save_bytes(job: JobSpec, parts: ParamParts, prec: Precision, lora: LoraLayout, states: States) -> SaveBytes:
    """The worst of the save steps a run takes: the model always (TRL's final save_model), the optimizer with every
    checkpoint unless save_strategy is "no" or save_only_model."""
    steps = [_model_step(job, parts, prec, lora, states)]
    if job.train.save_strategy != "no" and not job.train.save_only_model:
        steps.append(_optimizer_step(job, parts, prec, lora))
    return worst(steps)

"""Sequence-split layouts the planner tries: context parallelism on FSDP2 and sequence parallelism on ZeRO-3.

They are searched when the data-parallel layouts leave nothing that fits, or fit only by offloading activations —
the regime where a long row's activations, not the model states, fill the GPU, and where splitting the row over cp
(or sp) ranks gives the memory back without copying it to the host. Each layout is a sharding name such as
`fsdp2+cp4` (FSDP2 over the dp_shard × cp mesh, cp 4, dp_shard world/4) or `zero3+sp8`, over the divisors of the
world size (accelerate: the sizes multiply to num_processes; DeepSpeed: sp divides the world). A layout changes what
one optimizer step holds: world / cp ranks train different batches (transformers trainer.py dp_world_size), so
batch × accumulation grows to keep the global batch. Layouts TRL or the libraries refuse for this job (packing under
CP, heads that do not divide over sp, …) are pruned by hpcmem.job.mesh_rules like any other combination.
"""

from __future__ import annotations

from math import lcm
from typing import Any, Collection, Mapping

from hpcmem.job.jobspec import JobSpec
from hpcmem.plan.fixed import _divisors, axis_fixed

# sharding name of the planner → the data-parallel sharding a layout is built on
CP_BASES = ("fsdp2", "fsdp2+offload")
SP_BASES = ("zero3", "zero3+offload_opt")
# Largest split searched: the ranks of one row exchange k/v (CP) or every head (SP) once per layer, which only pays
# inside fast interconnect domains; TRL's own long-context example splits a row over the 8 GPUs of one node. A bound
# on the search, not a rule: a given cp_size/sp_size of any size is estimated.
MAX_SPLIT = 64
# fields that fix the layout when given (they belong to the sharding axis)
LAYOUT_FIELDS = ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "sp_size", "cp_comm_strategy",
                 "sp_attn_implementation")


def split(name: str) -> tuple[str, str, int]:
    """`fsdp2+cp4` → ("fsdp2", "cp", 4); a data-parallel name → (name, "", 1)."""
    base, _, last = name.rpartition("+")
    for kind in ("cp", "sp"):
        if base and last.startswith(kind) and last[len(kind):].isdigit():
            return base, kind, int(last[len(kind):])
    return name, "", 1


def layout_fields(name: str, world: int) -> dict[str, Any]:
    """The ParallelSpec fields a layout name adds to its base sharding's."""
    _, kind, size = split(name)
    if kind == "cp":
        return {"cp_size": size, "dp_shard_size": world // size}
    if kind == "sp":
        return {"sp_size": size}
    return {}


def train_changes(job: JobSpec, name: str) -> dict[str, Any]:
    """What a layout asks of the TRL config: rows padded to a multiple of 2·cp (torch's load balancing) or sp
    (DeepSpeed's sequence adapter), hpcmem.job.mesh_rules."""
    _, kind, size = split(name)
    if not kind:
        return {}
    unit = 2 * size if kind == "cp" else size
    return {"pad_to_multiple_of": lcm(job.train.pad_to_multiple_of or 1, unit)}


def layout_names(job: JobSpec) -> list[str]:
    """Every layout worth estimating for the job: SFT (the trainer TRL splits sequences for), more than one rank."""
    world = job.parallel.world_size
    if job.train.trainer != "sft" or world < 2:
        return []
    sizes = [d for d in _divisors(world, MAX_SPLIT) if d > 1]
    return [f"{base}+cp{d}" for d in sizes for base in CP_BASES] + \
        [f"{base}+sp{d}" for d in sizes for base in SP_BASES]


def wanted(plans: list, fixed: Collection[str]) -> bool:
    """Search layouts? Only when the sharding is free, and no data-parallel plan fits or every one that does
    offloads activations."""
    if axis_fixed("sharding", fixed):
        return False
    return not plans or all(p.knobs.activation_offloading for p in plans)


def batch_axes(ax: Mapping[str, list], job: JobSpec, fixed: Collection[str], global_batch_size: int,
               names: list[str]) -> list[dict[str, list]]:
    """The knob axes for each group of layouts sharing a data-parallel size: batch × accumulation × (world / split)
    = global batch, the other axes as the data-parallel search had them."""
    world = job.parallel.world_size
    own = job.train
    out = []
    for size in sorted({split(n)[2] for n in names}):
        dp = world // size
        if global_batch_size % dp:
            continue
        per_dp = global_batch_size // dp
        if axis_fixed("batch", fixed):
            batches = [own.per_device_train_batch_size] if per_dp % own.per_device_train_batch_size == 0 else []
        else:
            batches = _divisors(per_dp)
        if "gradient_accumulation_steps" in fixed:
            batches = [b for b in batches if b * own.gradient_accumulation_steps == per_dp]
        if batches:
            out.append({**ax, "sharding": [n for n in names if split(n)[2] == size], "batch": batches,
                        "pack": _packs(ax["pack"], job), "_per_gpu": [per_dp]})
    return out


def _packs(packs: list[str], job: JobSpec) -> list[str]:
    """Rows are not packed for a layout unless the job packs them already: CP drops the block-diagonal mask that
    keeps packed documents apart (accelerate `_attach_context_parallel_hooks`; TRL refuses packing), and Ulysses drops
    it too for every kernel but FlashAttention's (DeepSpeed ulysses_sp.py `uattn_wrapper`) — the planner does not
    switch on a setting that would let documents attend to each other."""
    own = "packing" if job.train.packing else "padding_free" if job.train.padding_free else "padded"
    if "flash" in job.train.attn_implementation:
        return packs
    return [p for p in packs if p in (own, "padded")]

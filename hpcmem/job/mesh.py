"""The device mesh of a job: accelerate's ParallelismConfig (dp_replicate × dp_shard × tp × cp, or sp under DeepSpeed)
as it lands on the ranks — what each rank shards, which ranks share a sequence — and accelerate's own rules for it.

Sizes carry accelerate's names (accelerate/parallelism_config.py `ParallelismConfig`; an accelerate YAML writes them as
`parallelism_config_<name>` keys, hpcmem.job.parallelism). 1 means the dimension is off; with every size 1 the job
is the plain layout of its distributed_type (FSDP / ZeRO over all ranks, DDP), as accelerate runs it without a
parallelism config.

Where each dimension acts (accelerate 1.15, torch 2.13, DeepSpeed 0.19):
- FSDP2 shards parameters, gradients and optimizer states over the flattened `dp_shard_cp` mesh (dp_shard × cp;
  ParallelismConfig.dp_shard_cp_dim_names, `fsdp_dim_names`) and replicates them over `dp_replicate` (HSDP);
- context parallelism (`cp_size`, backend torch) splits every sequence into cp chunks with torch's
  `context_parallel` (accelerator.py `_prepare_cp`, `maybe_context_parallel`), FSDP2 only;
- sequence parallelism (`sp_size`, backend deepspeed: ALST/Ulysses) splits every sequence into sp chunks under
  DeepSpeed (accelerator.py `_prepare_deepspeed` registers `UlyssesSPAttentionHF`); DeepSpeed partitions ZeRO states
  over its sequence-data-parallel group, i.e. every rank (deepspeed/runtime/engine.py `seq_data_parallel_group`,
  sequence_parallel/parallel_state_sp.py `initialize_sequence_parallel`), and no torch mesh is built
  (ParallelismConfig.build_device_mesh returns None);
- data parallelism proper is world / (tp × cp × sp) (transformers trainer.py `get_total_train_batch_size`'s
  dp_world_size): the ranks of one cp/sp group train one shared batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hpcmem.job.spec import ParallelSpec

SIZE_FIELDS = ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "sp_size")
CP_COMM_STRATEGIES = ("allgather", "alltoall")      # torch/distributed/tensor/experimental `set_rotate_method`


@dataclass(frozen=True, kw_only=True)
class Layout:
    """What a ParallelSpec's sizes mean per rank (derived; build with `layout_of`)."""

    world: int
    dp_replicate: int
    dp_shard: int
    tp: int
    cp: int
    sp: int
    backend: str             # FSDP | DEEPSPEED | MULTI_GPU | NO (the job's distributed_type)

    @property
    def active(self) -> bool:
        """A parallelism config is in force (some size > 1): accelerate builds a mesh from it."""
        return max(self.dp_replicate, self.dp_shard, self.tp, self.cp, self.sp) > 1

    @property
    def seq_shards(self) -> int:
        """Ranks one sequence is split over (context or sequence parallelism; they exclude each other)."""
        return self.cp * self.sp

    @property
    def data_parallel(self) -> int:
        """Ranks that train different batches (transformers trainer.py: world // tp // cp // sp)."""
        return max(1, self.world // (self.tp * self.cp * self.sp))

    @property
    def state_shards(self) -> int:
        """Ranks that share one copy of the model states: FSDP2's dp_shard × cp mesh under a parallelism config, every
        rank otherwise (plain FSDP / ZeRO, and ZeRO under sequence parallelism)."""
        if self.backend == "FSDP" and self.active:
            return self.dp_shard * self.cp
        return self.world

    def label(self) -> str:
        """`dp_shard 2 × cp 4`: the dimensions in force, in accelerate's mesh order (parallelism_config.py
        `_get_mesh`)."""
        if self.sp > 1:
            return f"sp {self.sp} × dp {self.data_parallel}"
        dims = [(n, s) for n, s in (("dp_replicate", self.dp_replicate), ("dp_shard", self.dp_shard), ("cp", self.cp),
                                    ("tp", self.tp)) if s > 1]
        return " × ".join(f"{n} {s}" for n, s in dims)


def layout_of(par: ParallelSpec) -> Layout:
    return Layout(world=par.world_size, dp_replicate=par.dp_replicate_size, dp_shard=par.dp_shard_size,
                  tp=par.tp_size, cp=par.cp_size, sp=par.sp_size, backend=par.distributed_type)


def layout_problems(par: ParallelSpec) -> list[str]:
    """accelerate's and DeepSpeed's verdicts on the sizes, each with its source; [] when the layout can run."""
    out = [f"{name} must be ≥ 1 (accelerate ParallelismConfig); got {getattr(par, name)}"
           for name in SIZE_FIELDS if getattr(par, name) < 1]
    if out:
        return out
    if par.cp_comm_strategy not in CP_COMM_STRATEGIES:
        out.append(f"cp_comm_strategy must be one of {', '.join(CP_COMM_STRATEGIES)} (torch set_rotate_method); "
                   f"got {par.cp_comm_strategy!r}")
    lay = layout_of(par)
    if not lay.active:
        return out
    if lay.cp > 1 and lay.sp > 1:
        out.append(f"cp_size {lay.cp} and sp_size {lay.sp} exclude each other (accelerate ParallelismConfig: context "
                   "and sequence parallelism are mutually exclusive); set one of them to 1")
    if (lay.tp > 1 or lay.cp > 1) and lay.dp_replicate > 1 and lay.dp_shard == 1:
        out.append("tp_size/cp_size > 1 with dp_replicate_size > 1 needs dp_shard_size > 1 (accelerate "
                   "ParallelismConfig: TP/CP do not compose with pure data parallelism)")
    out += _backend_problems(par, lay)
    return out


def _backend_problems(par: ParallelSpec, lay: Layout) -> list[str]:
    out = []
    total = lay.dp_replicate * lay.dp_shard * lay.tp * lay.cp * lay.sp
    sizes = (f"dp_replicate {lay.dp_replicate} × dp_shard {lay.dp_shard} × tp {lay.tp} × cp {lay.cp} × "
             f"sp {lay.sp} = {total}")
    if lay.sp > 1:
        if not par.deepspeed:
            out.append(f"sp_size {lay.sp} needs distributed_type DEEPSPEED: accelerate registers ALST/Ulysses only "
                       f"when it prepares a DeepSpeed engine (accelerator.py `_prepare_deepspeed`); under "
                       f"{par.distributed_type} the sequence would not be split")
        elif lay.world % lay.sp:
            out.append(f"num_processes {lay.world} must be a multiple of sp_size {lay.sp} (DeepSpeed "
                       "parallel_state_sp.initialize_sequence_parallel)")
        if lay.tp > 1:
            out.append("tp_size > 1 with sp_size > 1 is not modelled (DeepSpeed builds no tensor-parallel mesh)")
        return out
    if total != lay.world:
        out.append(f"the parallelism config covers {sizes} ranks but num_processes is {lay.world} (accelerate "
                   "ParallelismConfig._validate_accelerator: total_size must equal num_processes)")
    if par.fsdp and par.fsdp_version == 1:
        out.append("a parallelism config needs FSDP version 2 (accelerate launch refuses --use_parallelism_config "
                   "with fsdp_version 1: commands/launch.py _validate_launch_command)")
    elif par.fsdp and lay.dp_shard == 1 and lay.cp == 1:
        out.append("FSDP2 with a parallelism config needs dp_shard_size or cp_size > 1: FSDP shards over the "
                   "dp_shard × cp mesh (accelerate ParallelismConfig._validate_accelerator)")
    if lay.cp > 1 and not par.fsdp:
        out.append(f"cp_size {lay.cp} needs distributed_type FSDP (version 2): accelerate's context parallelism is "
                   "torch's, on an FSDP2 mesh (accelerator.py `maybe_context_parallel`)")
    if lay.dp_shard > 1 and not par.fsdp:
        out.append(f"dp_shard_size {lay.dp_shard} shards only under FSDP2 (accelerate ParallelismConfig: dp_shard is "
                   f"FSDP); {par.distributed_type} keeps whole states per rank — use distributed_type FSDP or "
                   "dp_replicate_size")
    if lay.tp > 1:
        out.append(f"tp_size {lay.tp}: tensor parallelism is not modelled by hpcmem — accelerate only prepares a "
                   "model whose parameters transformers already loaded as DTensors (accelerator.py `_prepare_tp`; TRL "
                   "loads the model whole), and a tensor-parallel load (model_init_kwargs distributed_config) "
                   "replaces this parallelism config with the model's own (transformers trainer.py)")
    return out

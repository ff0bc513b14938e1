"""The `parallelism_config` block of an accelerate YAML, read and written the way accelerate 1.15 reads it.

accelerate's launcher copies every key of the block, unchanged, onto its parsed arguments
(commands/launch.py `_validate_launch_command`: `setattr(args, key, value)` for each key of a dict section; only
`fsdp_config`, `fp8_config` and `dynamo_config` get a prefix added), then hands the `parallelism_config_*` arguments to
the training processes as PARALLELISM_CONFIG_* variables (utils/launch.py `prepare_extend_env_parallelism_config`),
from which `Accelerator` builds its ParallelismConfig. So the block's keys must carry the `parallelism_config_` prefix,
as `accelerate config` writes them (commands/config/cluster.py) and TRL's own examples do
(examples/accelerate_configs/context_parallel_8gpu.yaml): an unprefixed `cp_size: 4` lands on an argument nothing
reads, and the job runs with every size 1. hpcmem refuses such a key rather than estimate a layout accelerate would not
run. Values accelerate's ParallelismConfig refuses (a cp_backend other than torch, an sp_backend other than deepspeed)
are refused with its rule.
"""

from __future__ import annotations

from typing import Any

from hpcmem.errors import HpcmemError
from hpcmem.inputs.values import shown

PREFIX = "parallelism_config_"
# accelerate 1.15's launch arguments of the ParallelismConfig group (commands/launch.py `launch_command_parser`),
# without the prefix → the hpcmem setting each becomes (None: read by accelerate, no memory effect modelled).
ARGUMENTS: dict[str, str | None] = {
    "dp_replicate_size": "dp_replicate_size", "dp_shard_size": "dp_shard_size", "tp_size": "tp_size",
    "cp_size": "cp_size", "cp_backend": None, "cp_comm_strategy": "cp_comm_strategy", "sp_size": "sp_size",
    "sp_backend": None, "sp_seq_length": None, "sp_seq_length_is_variable": None,
    "sp_attn_implementation": "sp_attn_implementation",
}
BACKENDS = {"cp_backend": "torch", "sp_backend": "deepspeed"}    # the only values ParallelismConfig accepts
SIZES = ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "sp_size")


def parallelism_settings(block: Any, source: str, distributed_type: Any = None) -> dict[str, Any]:
    """hpcmem settings from the block (accelerate names, unprefixed); keys accelerate reads but hpcmem does not model
    are returned under their YAML name so that they are listed back as ignored."""
    if block is None or block == {}:
        return {}
    if not isinstance(block, dict):
        raise HpcmemError(f"{source}: parallelism_config must be a mapping of parallelism_config_* keys; "
                          f"got {shown(block)}")
    bare = [key for key in block if key in ARGUMENTS]
    if bare:
        fixed = ", ".join(f"{PREFIX}{key}: {shown(block[key])}" for key in bare)
        raise HpcmemError(
            f"{source}: parallelism_config key(s) {', '.join(bare)} are not read by accelerate 1.15 — its launcher "
            f"copies the block's keys verbatim onto its {PREFIX}* arguments (commands/launch.py), so they would be "
            f"dropped and the job would run without them; write {fixed}")
    out: dict[str, Any] = {}
    for key, value in block.items():
        name = key[len(PREFIX):] if isinstance(key, str) and key.startswith(PREFIX) else None
        if name is None:
            out[f"parallelism_config.{shown(key, 40)}"] = value      # accelerate ignores it too
        elif name in BACKENDS:
            if value != BACKENDS[name]:
                raise HpcmemError(f"{source}: {key} must be {BACKENDS[name]!r} (accelerate ParallelismConfig accepts "
                                  f"no other {name}); got {shown(value)}")
        elif ARGUMENTS.get(name):
            out[ARGUMENTS[name]] = value
        else:
            out[key] = value         # read by accelerate without a memory effect, or unknown to it: listed as ignored
    _all_ones(out, source, distributed_type)
    return out


def _all_ones(out: dict[str, Any], source: str, distributed_type: Any) -> None:
    """A non-empty block turns accelerate's parallelism config on (`use_parallelism_config`); with every size 1,
    accelerate sets dp_replicate to the world size, which FSDP2 cannot shard over (ParallelismConfig
    `_validate_accelerator`)."""
    sizes = [out.get(name, 1) for name in SIZES]
    if distributed_type == "FSDP" and all(str(v).strip() == "1" for v in sizes):
        raise HpcmemError(f"{source}: parallelism_config leaves every size at 1 under FSDP: accelerate then makes "
                          "the whole world dp_replicate and refuses FSDP2 with nothing to shard over "
                          "(ParallelismConfig._validate_accelerator); set parallelism_config_dp_shard_size (or "
                          "cp_size) or drop the block")


def parallelism_block(par: Any) -> dict[str, Any] | None:
    """The block for a ParallelSpec whose layout is active (hpcmem.job.mesh), keys as accelerate reads them; None
    otherwise (accelerate then runs the plain layout of distributed_type)."""
    if not par.layout.active:
        return None
    block: dict[str, Any] = {PREFIX + name: getattr(par, name) for name in SIZES}
    if par.cp_size > 1:
        block[PREFIX + "cp_backend"] = BACKENDS["cp_backend"]
        block[PREFIX + "cp_comm_strategy"] = par.cp_comm_strategy
    if par.sp_size > 1:
        block[PREFIX + "sp_backend"] = BACKENDS["sp_backend"]
        block[PREFIX + "sp_attn_implementation"] = par.sp_attn_implementation
    return block


# accelerate's FSDP1 sharding strategies, numbered as torch's ShardingStrategy (utils/constants.py
# FSDP_SHARDING_STRATEGY; utils/dataclasses.py FullyShardedDataParallelPlugin.__post_init__ reads a name or its number)
FSDP1_STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2")


def reshard_after_forward(value: Any, fsdp_version: Any, source: str) -> Any:
    """`fsdp_reshard_after_forward` as accelerate reads it: a boolean for FSDP2; for FSDP1 a sharding strategy (TRL's
    fsdp1.yaml: FULL_SHARD), which hpcmem keeps as the boolean it means — FULL_SHARD frees the gathered unit after
    forward, SHARD_GRAD_OP keeps it. The other FSDP1 strategies are not modelled."""
    if str(fsdp_version) != "1" or isinstance(value, bool):
        return value
    text = str(value).strip().upper()
    name = FSDP1_STRATEGIES[int(text) - 1] if text.isdigit() and 1 <= int(text) <= 5 else text
    if name in FSDP1_STRATEGIES[:2]:
        return name == "FULL_SHARD"
    if name in FSDP1_STRATEGIES:
        raise HpcmemError(f"{source}: fsdp_reshard_after_forward {name} is not modelled (hpcmem estimates FSDP1's "
                          "FULL_SHARD and SHARD_GRAD_OP); use one of them or FSDP2")
    raise HpcmemError(f"{source}: fsdp_reshard_after_forward must be one of {', '.join(FSDP1_STRATEGIES)} under FSDP1 "
                      f"(accelerate FullyShardedDataParallelPlugin); got {shown(value)}")

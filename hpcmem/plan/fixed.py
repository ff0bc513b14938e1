"""The search axes a user's own flags fix, and the divisor lists the search walks."""

from __future__ import annotations

from collections.abc import Collection

FIXING_FLAGS = {
    "gc": ("gradient_checkpointing", "gradient_checkpointing_kwargs"),
    "activation_offloading": ("activation_offloading",),
    # a length profile's worst micro-batch (--lengths) holds for the given batch and packing only
    "pack": ("packing", "padding_free", "packing_strategy", "lengths"),
    "sharding": ("accelerate_config", "distributed_type", "zero_stage", "offload_optimizer_device",
                 "offload_param_device", "fsdp_version", "fsdp_offload_params", "fsdp_reshard_after_forward",
                 "dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "sp_size", "cp_comm_strategy",
                 "sp_attn_implementation"),
    "peft": ("use_peft", "load_in_4bit", "load_in_8bit"),
    "batch": ("per_device_train_batch_size", "lengths"),
    "accum": ("gradient_accumulation_steps",),
    "expandable_segments": ("expandable_segments",),
    # a user who set the autocast precision (or turned it off for fp32 training) chose the numerics: the load stays
    "dtype": ("dtype", "model_init_kwargs", "bf16", "fp16"),
    "optim": ("optim", "optim_args"),
}


def axis_fixed(axis: str, fixed: Collection[str]) -> bool:
    """Whether one of the flags that fix `axis` (FIXING_FLAGS) is among the user's `fixed` flags."""
    return any(f in fixed for f in FIXING_FLAGS[axis])


# The micro-batch axis: divisors of the per-GPU batch up to this many rows (plus the job's own). The search stays
# bounded whatever global batch is asked for; a micro-batch of more rows is searched only when the job has it.
MAX_SEARCHED_BATCH = 1024


def _divisors(n: int, cap: int = MAX_SEARCHED_BATCH) -> list[int]:
    """Divisors of n up to `cap`: at most `cap` trial divisions, however large n is."""
    return [d for d in range(1, min(n, cap) + 1) if n % d == 0]

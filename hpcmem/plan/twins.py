"""Plans that are the same job on this hardware, shown once with the others named.

The declared equivalence: two combinations are twins when their knobs differ only in
- the sharding, within one family below (names that can give the same memory and speed), and/or
- the load dtype (DeepSpeed casts the loaded module to its 16-bit dtype, engine `_configure_distributed_model`, so a
  float32 and a bfloat16 load train the same bf16 weights under ZeRO),
- the optimizer (DeepSpeed keeps its own fp32 Adam partitions whatever `optim` says, hpcmem.estimate.states),
AND `hpcmem estimate` gives both the same device peak, safe bound and host RAM per node and the throughput model the
same tokens/s — the numbers the planner judges by cannot tell them apart. Examples: ZeRO-1 and ZeRO-2 partition gradients alike in
DeepSpeed ≥ 0.19 (hpcmem.estimate.states), so on one GPU (nothing to shard, no collective) both are the same job;
FSDP2 and ZeRO-3 where their estimates agree. DDP and ZeRO on one GPU are not twins: DeepSpeed adds an fp32 master
copy and fp32 Adam states (the estimate says so), and a twin is only declared when the numbers agree.
"""

from __future__ import annotations

from typing import Any

from hpcmem.plan.knobs import Knobs

# sharding name → family; names outside every family are their own
FAMILIES = {"ddp": "dp", "zero1": "dp", "zero2": "dp", "zero3": "sharded", "fsdp2": "sharded", "fsdp2+sync": "sharded",
            "zero3+offload_all": "sharded+offload", "fsdp2+offload": "sharded+offload",
            "fsdp2+offload+sync": "sharded+offload"}


def canonical(k: Knobs) -> Knobs:
    """The knobs with the declared-equivalent axes blanked (sharding → its family, dtype and optimizer → any)."""
    return k._replace(sharding=FAMILIES.get(k.sharding, k.sharding), dtype="*", optim="*")


def twin_key(k: Knobs, est: Any, speed: Any) -> tuple:
    """Equal keys ⇔ twins (module docstring)."""
    return (canonical(k), est.device_peak_bytes, est.verdict.safe_device_peak_bytes,
            est.host.per_node_bytes if est.host else None, round(speed.tokens_per_s_per_gpu, 6))


def difference(a: Knobs, b: Knobs, one_process: bool) -> str:
    """What tells twin b from plan a, in words ("zero2", "float32 load", "zero2, float32 load")."""
    bits = []
    if a.sharding != b.sharding:
        bits.append("single GPU" if one_process and b.sharding == "ddp" else b.sharding)
    if a.dtype != b.dtype:
        bits.append(f"{b.dtype} load")
    if a.optim != b.optim:
        bits.append(b.optim)
    return ", ".join(bits)

"""What saves the memory when a knob is on: the mechanism a reason names (a cast, a shard, an offload, recompute …).

Read off the planned job itself (its ParallelSpec and TrainSpec), so a name is never credited with another's saving:
on one GPU ZeRO-1/2 partition nothing over one rank (ZeRO §5: P_os over N_d = 1 ranks is the whole state); what
DeepSpeed saves there on a float32 load is its cast of the module to the 16-bit dtype (engine
`_configure_distributed_model`, hpcmem.estimate.states), and the reason says "cast".
"""

from __future__ import annotations

from hpcmem.job.jobspec import JobSpec


def sharding_mechanism(job: JobSpec) -> str:
    """The mechanisms of a ZeRO / FSDP layout on this job: cast, shard over n ranks, offload, split of a row."""
    par, t = job.parallel, job.train
    n = par.layout.state_shards
    bits = []
    if par.deepspeed and (t.bf16 or t.fp16) and job.weight_bytes == 4:
        bits.append("cast: DeepSpeed casts the float32-loaded weights to 16-bit (fp32 master and Adam states kept)")
    if par.deepspeed and par.zero_stage >= 1:
        # DeepSpeed ≥ 0.19 partitions gradients under stage 1 as under stage 2 (hpcmem.estimate.states)
        parts = "optimizer states + gradients" + (" + weights" if par.zero_stage == 3 else "")
        bits.append(f"shard: {parts} over {n} ranks" if n > 1 else
                    f"no shard: ZeRO-{par.zero_stage} over one rank shards nothing")
    if par.fsdp:
        bits.append(f"shard: weights, gradients and optimizer states over {n} ranks" if n > 1 else
                    "no shard: FSDP2 over one rank shards nothing")
    if par.offload_optimizer_device != "none":
        bits.append("offload: optimizer states to host RAM")
    if par.offload_param_device != "none":
        bits.append("offload: weights to host RAM")
    if par.fsdp and par.fsdp_offload_params:
        bits.append("offload: weights, gradients and optimizer states to host RAM")
    if par.cp_size > 1 or par.sp_size > 1:
        bits.append(f"split: each row's activations over {max(par.cp_size, par.sp_size)} ranks")
    return "; ".join(bits)


# knob (the first word of a reasons() neighbour name) → what saves the memory; a sharding knob's depends on the job
MECHANISMS = {
    "gradient_checkpointing": "recompute: layers rerun their forward in backward, only the checkpoints are kept",
    "activation_offloading": "offload: saved activations to host RAM",
    "packing": "no padding: rows hold documents end to end",
    "padding_free": "no padding: rows hold documents end to end",
    "dtype": "cast at load: weights, gradients and AdamW states in 2 bytes, not 4",
    "optim": "quantize: AdamW states in 8 bits with a block-wise fp32 scale (bitsandbytes)",
    "lora": "freeze: only the adapters get gradients and optimizer states",
    "qlora": "freeze + quantize: adapters only, 4-bit base weights",
    "expandable_segments": "allocator: expandable segments cut fragmentation",
    "sync_each_batch": "shard: gradients reduce-scattered every micro-batch, not kept whole until the window's last",
    "per_device_train_batch_size": "smaller micro-batch: fewer activations at once, accumulation keeps the batch",
}


def mechanism(name: str, job: JobSpec) -> str:
    """The mechanism of the knob `name` (a reasons() neighbour name) in the planned `job`."""
    return MECHANISMS.get(name.split(" ")[0]) or sharding_mechanism(job)

"""Pure renderers: one JobSpec → the accelerate config, the DeepSpeed config and the FSDP2 block, as dicts.

Never TRL's shipped `trl/accelerate_configs/*.yaml`: they all say `num_processes: 8, num_machines: 1,
rdzv_backend: static`. The values here come from the spec; per-task values (machine_rank, main_process_ip/port) are
left to the launcher command line, which expands them inside each SLURM task.

Multi-node rendezvous is c10d. accelerate (commands/launch.py → utils/launch.py `prepare_multi_gpu_env` and
`prepare_deepspeed_cmd_env`, 1.15) hands torchrun `--rdzv_endpoint ip:port` only when `same_network` is false; with
`same_network: true` it passes master_addr/port, which c10d ignores, and torchrun's c10d falls back to
`localhost:29400` (torch/distributed/elastic/rendezvous/utils.py `parse_rendezvous_endpoint`) — every node would
rendezvous with itself. So multi-node configs say `same_network: false`. One node uses the static rendezvous on
localhost with the job-derived MASTER_PORT (c10d without an endpoint would take the fixed port 29400 and collide with
a second job on the node).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hpcmem.job.parallelism import parallelism_block

if TYPE_CHECKING:
    from hpcmem.job.jobspec import JobSpec

AUTO = "auto"   # filled by transformers' HfTrainerDeepSpeedConfig from TrainingArguments and the model


def mixed_precision(job: JobSpec) -> str:
    """accelerate's mixed_precision from TRL's bf16/fp16 flags."""
    return "bf16" if job.train.bf16 else "fp16" if job.train.fp16 else "no"


def accelerate_config(job: JobSpec, *, deepspeed_config_file: str | None = None, use_cpu: bool = False
                      ) -> dict[str, Any]:
    """The accelerate YAML (accelerate/commands/config/config_args.py ClusterConfig keys, nothing else).

    `deepspeed_config_file`: where the DeepSpeed JSON will be; with it, accelerate refuses `mixed_precision` and the
    ZeRO keys in this file (utils/dataclasses.py `_deepspeed_config_checks`), so they live in the JSON only.
    `use_cpu`: run on CPU (gloo) — the launcher path stays torchrun, which is what the test cluster exercises.
    """
    par = job.parallel
    multi_node = par.num_machines > 1
    config: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "debug": False,
        "distributed_type": par.distributed_type,
        "downcast_bf16": "no",
        "main_training_function": "main",
        "num_machines": par.num_machines,
        "num_processes": par.world_size,
        "rdzv_backend": "c10d" if multi_node else "static",
        "same_network": not multi_node,
        "use_cpu": use_cpu,
    }
    if par.deepspeed:
        if deepspeed_config_file is None:
            raise ValueError("a DeepSpeed job needs deepspeed_config_file (the JSON from deepspeed_config)")
        config["deepspeed_config"] = {
            "deepspeed_config_file": deepspeed_config_file,
            "deepspeed_multinode_launcher": "standard",   # torchrun on each node; no pdsh/ssh hostfile
            "zero3_init_flag": par.zero_stage == 3 and par.zero3_init_flag,
        }
    else:
        config["mixed_precision"] = mixed_precision(job)
    if par.fsdp:
        config["fsdp_config"] = fsdp_config(job)
    block = parallelism_block(par)          # CP / SP / HSDP sizes, keys as accelerate's launcher reads them
    if block:
        config["parallelism_config"] = block
    return config


def deepspeed_config(job: JobSpec) -> dict[str, Any]:
    """DeepSpeed JSON: ZeRO stage, offload and precision from the spec; batch sizes, clipping and bucket sizes "auto".

    "auto" is resolved by transformers (integrations/deepspeed.py `HfTrainerDeepSpeedConfig.trainer_config_process`
    for batch/accumulation/clipping/optimizer, `trainer_config_finalize` for the hidden-size-based buckets), so the
    JSON cannot disagree with the TRL YAML. `stage3_gather_16bit_weights_on_model_save` (the spec's
    zero3_save_16bit_model, on in TRL's zero3.yaml) lets `save_model` write a full 16-bit model under ZeRO-3.
    """
    par, t = job.parallel, job.train
    # zero_bucket_sizes "deepspeed": the bucket keys are left out, so DeepSpeed's defaults apply as in a run without
    # a JSON (hpcmem.estimate.zero_buckets)
    own = par.zero_bucket_sizes == "auto"
    zero: dict[str, Any] = {
        "stage": par.zero_stage,
        **({"overlap_comm": True} if own else {}),
        "contiguous_gradients": True,
        **({"reduce_bucket_size": AUTO} if own else {}),
    }
    if par.zero_stage >= 2:
        zero["allgather_bucket_size"] = 5e8
    if par.offload_optimizer_device != "none":
        zero["offload_optimizer"] = {"device": par.offload_optimizer_device, "pin_memory": True}
    if par.zero_stage == 3:
        zero.update({
            **({"stage3_prefetch_bucket_size": AUTO, "stage3_param_persistence_threshold": AUTO} if own else {}),
            "stage3_max_live_parameters": 1e9,
            "stage3_max_reuse_distance": 1e9,
            "stage3_gather_16bit_weights_on_model_save": par.zero3_save_16bit_model,
            "sub_group_size": 1e9,
        })
        if par.offload_param_device != "none":
            zero["offload_param"] = {"device": par.offload_param_device, "pin_memory": True}
    return {
        "train_batch_size": AUTO,
        "train_micro_batch_size_per_gpu": AUTO,
        "gradient_accumulation_steps": AUTO,
        "gradient_clipping": AUTO,
        "bf16": {"enabled": t.bf16},
        "fp16": {"enabled": t.fp16},
        "zero_optimization": zero,
        "steps_per_print": 1_000_000,
        "wall_clock_breakdown": False,
    }


def fsdp_config(job: JobSpec) -> dict[str, Any]:
    """accelerate's FSDP block (keys as in trl/accelerate_configs/fsdp2.yaml), version and offload from the spec.

    Activation checkpointing stays TRL's `gradient_checkpointing` (one name per setting); the state dict is sharded by
    default (the spec's fsdp_state_dict_type) so that checkpoints (and requeue resumes) do not gather the full model on
    rank 0.
    """
    par = job.parallel
    config: dict[str, Any] = {
        "fsdp_version": par.fsdp_version,
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_cpu_ram_efficient_loading": par.fsdp_cpu_ram_efficient_loading,
        "fsdp_sync_module_states": True,         # required with cpu_ram_efficient_loading (accelerate utils/launch.py)
        "fsdp_offload_params": par.fsdp_offload_params,
        "fsdp_reshard_after_forward": par.fsdp_reshard_after_forward,
        "fsdp_state_dict_type": par.fsdp_state_dict_type,
        "fsdp_activation_checkpointing": False,
    }
    if par.fsdp_version == 1:
        # FSDP1 takes a sharding strategy here (accelerate utils/dataclasses.py FullyShardedDataParallelPlugin).
        config["fsdp_reshard_after_forward"] = "FULL_SHARD" if par.fsdp_reshard_after_forward else "SHARD_GRAD_OP"
        config["fsdp_use_orig_params"] = True
    return config

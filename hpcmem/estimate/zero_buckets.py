"""DeepSpeed ZeRO's communication buffers: what a rank holds beyond its sharded states, and the bucket sizes behind them.

Bucket sizes (elements), by where the job's DeepSpeed config comes from (ParallelSpec.zero_bucket_sizes):
- "auto": hpcmem's JSON (hpcmem/launch/configs.py `deepspeed_config`) writes reduce_bucket_size,
  stage3_prefetch_bucket_size and stage3_param_persistence_threshold as "auto"; transformers fills them from the
  model's hidden size h (integrations/deepspeed.py `HfTrainerDeepSpeedConfig.trainer_config_finalize`): h², 0.9·h²,
  10·h. It writes overlap_comm true, stage3_max_live_parameters 1e9.
- "deepspeed": no JSON. accelerate's DeepSpeedPlugin then builds a config with the stage and offload only
  (accelerate utils/dataclasses.py `DeepSpeedPlugin.__post_init__`), so DeepSpeed's field defaults apply
  (deepspeed/runtime/zero/config.py `DeepSpeedZeroConfig`): reduce_bucket_size 5e8, stage3_prefetch_bucket_size 5e7,
  stage3_param_persistence_threshold 1e5, stage3_max_live_parameters 1e9, contiguous_gradients true, overlap_comm
  true under stage 3 and false under stages 1-2 (`overlap_comm_valid`).

Buffers (DeepSpeed 0.19; 16-bit, the model's dtype, DeepSpeedEngine `get_data_types` with grad_accum_dtype unset):
- ZeRO-3: one reduce bucket of reduce_bucket_size elements per gradient dtype, allocated when the optimizer is set up
  and kept for the run (runtime/zero/stage3.py `_setup_for_real_optimizer`, contiguous_gradients).
- ZeRO-1/2: one reduce bucket, two with overlap_comm, allocated at the first gradient of each backward and released at
  its end (runtime/zero/stage_1_and_2.py `setup_buckets`, `_release_ipg_buffers`): held through the backward only.
- allgather_bucket_size holds nothing: with NCCL's all_gather_into_tensor the updated partitions are gathered into
  the flat 16-bit groups in place (runtime/utils.py `all_gather_dp_groups` → `all_gather_into_tensor_dp_groups`).
- ZeRO-3's prefetch bucket and max_live_parameters bound the gathered parameters (hpcmem.estimate.states); the
  persistence threshold keeps small parameters whole on every rank (hpcmem.estimate.states `zero3_adapter_bytes`).
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcmem.job.jobspec import JobSpec

BUCKET_BYTES = 2                    # 16-bit gradients: the bucket takes the model's dtype (bf16 / fp16)
DS_REDUCE_BUCKET = 500_000_000      # DeepSpeedZeroConfig.reduce_bucket_size
DS_PREFETCH_BUCKET = 50_000_000     # DeepSpeedZeroConfig.prefetch_bucket_size (stage3_prefetch_bucket_size)
DS_PERSISTENCE = 100_000            # DeepSpeedZeroConfig.param_persistence_threshold
MAX_LIVE = 1_000_000_000            # stage3_max_live_parameters: DeepSpeed's default and what hpcmem writes


@dataclass(frozen=True, kw_only=True)
class ZeroBuckets:
    reduce_bucket: int              # elements
    prefetch_bucket: int            # elements (stage 3)
    persistence_threshold: int      # elements (stage 3)
    max_live: int                   # elements (stage 3)
    overlap_comm: bool
    source: str                     # in words, for the breakdown's notes


def zero_buckets(job: JobSpec) -> ZeroBuckets:
    """The bucket sizes the job's DeepSpeed engine runs with (see the module's docstring for where each comes from)."""
    par = job.parallel
    if par.zero_bucket_sizes == "deepspeed":
        return ZeroBuckets(reduce_bucket=DS_REDUCE_BUCKET, prefetch_bucket=DS_PREFETCH_BUCKET,
                           persistence_threshold=DS_PERSISTENCE, max_live=MAX_LIVE,
                           overlap_comm=par.zero_stage == 3, source="DeepSpeed's defaults (no DeepSpeed JSON)")
    h = job.model.hidden_size
    return ZeroBuckets(reduce_bucket=h * h, prefetch_bucket=int(0.9 * h * h), persistence_threshold=10 * h,
                       max_live=MAX_LIVE, overlap_comm=True, source="hpcmem's JSON, \"auto\" filled from hidden_size")


def resident_bucket_bytes(job: JobSpec) -> int:
    """ZeRO-3's reduce bucket, held from the optimizer's setup on (0 elsewhere)."""
    par = job.parallel
    if not (par.deepspeed and par.zero_stage == 3):
        return 0
    return zero_buckets(job).reduce_bucket * BUCKET_BYTES


def backward_bucket_bytes(job: JobSpec) -> int:
    """ZeRO-1/2's reduce bucket(s), held from the first gradient of a backward to its end (0 elsewhere)."""
    par = job.parallel
    if not (par.deepspeed and par.zero_stage in (1, 2)):
        return 0
    b = zero_buckets(job)
    return (2 if b.overlap_comm else 1) * b.reduce_bucket * BUCKET_BYTES

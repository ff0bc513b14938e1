"""TRL's, transformers' and DeepSpeed's verdicts on a job under context / sequence parallelism, checked before the
queue: each rule cites the place in the installed package that refuses it at run time (or hpcmem's reason for not
modelling it). `check_layout` adds errors to the job's Problems (hpcmem.job.rules.check_job calls it); `layout_warnings`
returns what the libraries accept but the user should know; `check_layout_settings` reads the raw settings for TRL
fields the spec does not carry (SFT's loss choices).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from hpcmem.errors import Problems, SpecError
from hpcmem.job.trainers import entry

if TYPE_CHECKING:
    from hpcmem.job.protocol import Job



# accelerate utils/dataclasses.py DeepSpeedSequenceParallelConfig.__post_init__: the kernels Ulysses can wrap, checked
# whenever the value is set (a hub-hosted FlashAttention kernel is named "<org>/<repo>" with "flash-attn" in it)
SP_ATTN_BUILTIN = ("flash_attention_2", "flash_attention_3", "sdpa")


def check_layout(job: Job, p: Problems) -> None:
    lay = job.parallel.layout
    t = job.train
    sp_attn = job.parallel.sp_attn_implementation
    if sp_attn not in SP_ATTN_BUILTIN and not ("/" in sp_attn and "flash-attn" in sp_attn):
        p.add(f"sp_attn_implementation must be one of {', '.join(SP_ATTN_BUILTIN)} or a hub-hosted FlashAttention "
              f"kernel such as kernels-community/flash-attn2 (accelerate DeepSpeedSequenceParallelConfig); got "
              f"{sp_attn!r}")
    if lay.seq_shards == 1:
        return
    what = f"cp_size {lay.cp}" if lay.cp > 1 else f"sp_size {lay.sp}"
    e = entry(t.trainer)
    if e.generates:
        p.add(f"{what}: {e.config_class} refuses sequence-dim parallelism (trl/trainer/{t.trainer}_config.py __post_init__: the "
              "trainer builds its inputs after generation, where the sequence cannot be sharded); set cp_size and "
              "sp_size to 1")
        return
    if e.rows_per_example == 2 or e.reference != "none":
        # DPO, Reward (chosen + rejected rows) and KTO (unpaired rows + KL rows): per-sequence log-probabilities
        p.add(f"{what} with {t.trainer}: not modelled — TRL 1.16 has no sequence-sharding path for its "
              "per-sequence log-probabilities (DPO/Reward's chosen/rejected forward, KTO's KL rows); hpcmem "
              "estimates context and sequence parallelism for SFT")
        return
    if lay.cp > 1:
        _check_cp(job, p)
    else:
        _check_sp(job, p)


def _check_cp(job: Job, p: Problems) -> None:
    t, m, cp = job.train, job.model, job.parallel.cp_size
    if t.packing:
        p.add(f"packing with cp_size {cp}: SFTTrainer refuses it (sft_trainer.py: context parallelism drops the "
              "block-diagonal mask that keeps packed documents apart); set packing false or cp_size 1")
    if t.attn_implementation != "sdpa":
        p.add(f"cp_size {cp} needs attn_implementation sdpa (transformers trainer.py "
              f"`_prepare_context_parallel_inputs`: context parallelism runs SDPA only); got {t.attn_implementation}")
    if m.sliding_window:
        p.add(f"cp_size {cp}: model {m.name} has sliding-window attention layers (window {m.sliding_window}); "
              "accelerate refuses them under context parallelism, which can only express full causal attention "
              "(big_modeling.py `_attach_context_parallel_hooks`)")
    if not t.pad_to_multiple_of or t.pad_to_multiple_of % (2 * cp):
        p.add(f"cp_size {cp} needs every batch's length to divide 2 × cp_size = {2 * cp}: set pad_to_multiple_of "
              f"to a multiple of {2 * cp} (torch shards the sequence into 2·cp load-balanced chunks only then, "
              "_context_parallel/_load_balancer.py `_create_default_load_balancer`; TRL's own 1M-token example "
              f"pads so); got {t.pad_to_multiple_of}")


def _check_sp(job: Job, p: Problems) -> None:
    t, m, par = job.train, job.model, job.parallel
    sp = par.sp_size
    if m.num_attention_heads % sp:
        p.add(f"sp_size {sp} must divide num_attention_heads {m.num_attention_heads} of {m.name} "
              "(DeepSpeed ulysses_sp.py UlyssesSPAttentionHF: heads are split over the sp ranks)")
    kv = m.num_key_value_heads
    if kv % sp and sp % kv:
        p.add(f"sp_size {sp} and num_key_value_heads {kv} of {m.name} must divide one another (DeepSpeed "
              "ulysses_sp.py UlyssesSPAttentionHF)")
    if t.attn_implementation == "eager":
        p.add(f"sp_size {sp} does not run eager attention (DeepSpeed ulysses_sp.py `register_with_transformers`: it "
              "needs a 4-D mask); use sdpa or a FlashAttention variant")
    elif par.sp_attn_implementation != t.attn_implementation:
        p.add(f"sp_attn_implementation {par.sp_attn_implementation} must be the model's attn_implementation "
              f"{t.attn_implementation} (DeepSpeed ulysses_sp.py `register_with_transformers` refuses a mismatch); "
              f"set parallelism_config_sp_attn_implementation: {t.attn_implementation}")
    if not t.pad_to_multiple_of or t.pad_to_multiple_of % sp:
        p.add(f"sp_size {sp} needs every batch's length to divide {sp}: set pad_to_multiple_of to a multiple of "
              f"{sp} (DeepSpeed ulysses_sp.py UlyssesSPDataLoaderAdapter.refill raises on any other length); got "
              f"{t.pad_to_multiple_of}")


def check_layout_settings(settings: Mapping[str, Any], job: Job) -> None:
    """SFT's losses DeepSpeed sequence parallelism cannot reduce (sft_trainer.py: under SP the loss is the model's own
    NLL, reduced across ranks by transformers' `deepspeed_sp_compute_loss`)."""
    if job.parallel.sp_size == 1 or job.train.trainer != "sft":
        return
    p = Problems()
    if settings.get("loss_type", "nll") == "dft":
        p.add(f"loss_type dft with sp_size {job.parallel.sp_size}: SFTTrainer refuses it (sft_trainer.py: DeepSpeed "
              "sequence parallelism reduces the model's own NLL only); use loss_type nll")
    smoothing = settings.get("label_smoothing_factor", 0) or 0
    try:
        smoothing = float(smoothing)
    except (TypeError, ValueError):
        raise SpecError(f"label_smoothing_factor must be a number; got {smoothing!r}") from None
    if smoothing > 0:
        p.add(f"label_smoothing_factor {smoothing} with sp_size {job.parallel.sp_size}: SFTTrainer refuses it "
              "(sft_trainer.py: DeepSpeed sequence parallelism reduces the model's own NLL only)")
    p.raise_if_any()


def layout_warnings(job: Job) -> list[str]:
    par, t = job.parallel, job.train
    lay = par.layout
    out = []
    if par.distributed_type == "NO" and par.num_processes > 1:
        out.append(f"distributed_type NO: accelerate launches one process whatever num_processes says "
                   f"({par.num_processes}; commands/launch.py `launch_command` → `simple_launcher`): "
                   "estimated on 1 GPU")
    if lay.sp > 1 and (lay.dp_shard > 1 or lay.dp_replicate > 1):
        out.append(f"dp_shard_size/dp_replicate_size do not act under DeepSpeed: ZeRO partitions over all {lay.world} "
                   "ranks and the sp groups are formed by DeepSpeed (accelerate builds no mesh for sequence "
                   "parallelism, parallelism_config.py `build_device_mesh`)")
    packed = t.packing or t.padding_free
    if lay.cp > 1 and packed and not t.packing:
        out.append("padding_free with context parallelism: the attention mask is dropped for is_causal "
                   "(accelerate `_attach_context_parallel_hooks`), so documents in one row attend to each other")
    if lay.sp > 1 and packed and "flash" not in t.attn_implementation:
        out.append(f"packed rows with sp_size {lay.sp} and {t.attn_implementation}: Ulysses drops the block-diagonal "
                   "mask (DeepSpeed ulysses_sp.py `uattn_wrapper`); FlashAttention keeps documents apart through "
                   "position_ids")
    return out

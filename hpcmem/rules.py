"""TRL 1.16's verdicts on combinations of settings: one source for the estimator, the planner and the launcher.

Each rule cites the place in the installed trl package that gives the verdict. `check_job` raises a SpecError listing
every error (what TRL refuses with an exception, or a field the trainer's config does not have); `job_warnings`
returns what TRL only warns about or silently changes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpcmem.errors import Problems
from hpcmem.layout_rules import check_layout, layout_warnings
from hpcmem.trl_fields import owners

if TYPE_CHECKING:
    from hpcmem.spec import JobSpec

CONFIG_CLASS = {"sft": "SFTConfig", "dpo": "DPOConfig", "reward": "RewardConfig", "grpo": "GRPOConfig",
                "rloo": "RLOOConfig"}
# Fields only some trainers' configs declare (hpcmem.trl_fields), with the value that means "not used" — so a
# default never trips the rule below.
_UNSET = {"disable_dropout": False, "packing": False, "padding_free": False, "activation_offloading": False,
          "precompute_ref_log_probs": False, "use_vllm": False, "vllm_enable_sleep_mode": False,
          "generation_batch_size": None, "steps_per_generation": None, "num_iterations": 1,
          "vllm_importance_sampling_correction": True}
FIELD_TRAINERS: dict[str, tuple[str, ...]] = {name: owners(name) for name in _UNSET}


def check_job(job: JobSpec) -> None:
    t, par = job.train, job.parallel
    p = Problems()
    for name, declared_by in FIELD_TRAINERS.items():
        if t.trainer not in declared_by and getattr(t, name) != _UNSET[name]:
            where = "/".join(CONFIG_CLASS[o] for o in declared_by)
            p.add(f"{name} is a {where} field; {CONFIG_CLASS[t.trainer]} has no {name} field — remove it "
                  f"or use `hpcmem estimate {declared_by[0]}`")
    # sft_trainer.py: padding_free without packing does not enforce max_length.
    if t.trainer == "sft" and t.padding_free and not t.packing and t.max_length is not None:
        p.add("padding_free=True without packing does not enforce max_length (SFTTrainer raises): enable packing "
              "(packing=True, packing_strategy=bfd) or set max_length None (--max_length none) with pre-truncated data")
    if t.selective_checkpointing:
        # sft_trainer.py: the SAC wrapper strips `selective`; other trainers pass it to torch.utils.checkpoint.
        if t.trainer != "sft":
            p.add(f"gradient_checkpointing_kwargs selective is SFT-only in TRL 1.16; {CONFIG_CLASS[t.trainer]} "
                  "passes it to torch.utils.checkpoint, which rejects it — drop it")
        if not t.gradient_checkpointing:
            p.add("gradient_checkpointing_kwargs={'selective': True} requires gradient_checkpointing=True")
        if t.gradient_checkpointing_kwargs.get("use_reentrant"):
            p.add("selective checkpointing requires non-reentrant checkpointing: set use_reentrant False or unset it")
        if t.use_peft and par.deepspeed and par.zero_stage == 3:
            p.add("selective checkpointing is not supported with PEFT + DeepSpeed ZeRO-3 (it forces reentrant "
                  "checkpointing); use full checkpointing or another ZeRO stage")
    if t.quantized and not t.use_peft:
        # transformers Trainer: "You cannot perform fine-tuning on purely quantized models".
        p.add("load_in_4bit/load_in_8bit train only adapters: add use_peft (QLoRA); transformers refuses to "
              "fine-tune a purely quantized model")
    if t.trainer in ("grpo", "rloo"):
        _check_generation(job, p)
    check_layout(job, p)            # context / sequence parallelism (hpcmem.layout_rules)
    p.raise_if_any()


def _check_generation(job: JobSpec, p: Problems) -> None:
    """grpo_config.py / rloo_config.py __post_init__: generation batch arithmetic."""
    t = job.train
    world = job.parallel.world_size
    if t.generation_batch_size is not None and t.steps_per_generation is not None:
        p.add("generation_batch_size and steps_per_generation can not both be set; set one of them")
        return
    gen = generation_batch_size(job)
    step = t.per_device_train_batch_size * world
    if gen % step:
        p.add(f"generation_batch_size {gen} must be a multiple of per_device_train_batch_size × num_processes "
              f"= {t.per_device_train_batch_size} × {world} = {step}")
    if gen % t.num_generations:
        p.add(f"generation_batch_size {gen} must be divisible by num_generations {t.num_generations}")
    if t.use_vllm and not t.ds3_gather_for_generation and job.parallel.zero_stage == 3:
        p.add("ds3_gather_for_generation=False is not compatible with vLLM generation; keep it True or drop use_vllm")


def generation_batch_size(job: JobSpec) -> int:
    """Rows generated per round across all ranks (grpo_config.py __post_init__)."""
    t = job.train
    world = job.parallel.world_size
    if t.generation_batch_size is not None:
        return t.generation_batch_size
    steps = t.steps_per_generation or t.gradient_accumulation_steps
    return t.per_device_train_batch_size * world * steps


def job_warnings(job: JobSpec) -> list[str]:
    t = job.train
    out: list[str] = []
    if t.trainer == "dpo" and t.padding_free:
        out.append("DPOTrainer 1.16 warns that padding_free is temporarily unavailable and falls back to padding; "
                   "estimated as padded")
    if t.trainer == "sft" and t.packing and t.packing_strategy == "wrapped" and t.padding_free:
        out.append("padding_free with packing_strategy wrapped is not recommended by TRL (documents mix in a row)")
    if t.trainer == "sft" and t.padding_free and not t.packing and t.per_device_train_batch_size == 1:
        out.append("padding-free with per_device_train_batch_size 1 gains nothing (TRL warns); raise the batch size")
    if t.trainer == "sft" and (t.padding_free or (t.packing and t.packing_strategy != "wrapped")) and \
            "flash" not in t.attn_implementation:
        out.append(f"padding-free rows with attn_implementation={t.attn_implementation}: transformers builds a "
                   "block-diagonal mask; a FlashAttention variant avoids it")
    if t.use_peft and job.parallel.deepspeed and job.parallel.zero_stage == 3 and t.gradient_checkpointing:
        out.append("PEFT + ZeRO-3 forces reentrant gradient checkpointing (TRL sets use_reentrant=True)")
    if job.parallel.distributed_type == "NO" and job.parallel.num_machines > 1:
        out.append("num_machines > 1 without a distributed type")
    return out + layout_warnings(job)

"""TRL 1.16's verdicts on combinations of settings: one source for the estimator, the planner and the launcher.

Each rule cites the place in the installed trl package that gives the verdict. `check_job` raises a SpecError listing
every error (what TRL refuses with an exception, or a field the trainer's config does not have); `job_warnings`
returns what TRL only warns about or silently changes.
"""

from __future__ import annotations

import re
from dataclasses import MISSING, fields
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from hpcmem.errors import Problems
from hpcmem.job.auto_classes import auto_class_problems
from hpcmem.job.generation_batch import generation_batch_size
from hpcmem.job.all_linear_rules import numbered_leaf_problems
from hpcmem.job.image_rules import image_job_problems
from hpcmem.job.kernel_limits import rwkv_problems, xlstm_dtype_problems, xlstm_problems
from hpcmem.job.lora_linear_rules import linear_subclass_problems
from hpcmem.job.lora_task_rules import lora_task_problems
from hpcmem.job.position_limits import position_problems
from hpcmem.job.reentrant_rules import reentrant_graph_problems
from hpcmem.job.mesh_rules import check_layout, layout_warnings
from hpcmem.job.spec import DTYPES, TrainSpec
from hpcmem.job.trainers import REGISTRY, entry
from hpcmem.models.coverage import requirement_problems
from hpcmem.job.param_wrapper_rules import param_wrapper_problems
from hpcmem.models.module_names import actual_names, reaches
from hpcmem.models.params import SIZED_MODULES

if TYPE_CHECKING:
    from hpcmem.job.protocol import Job
    from hpcmem.models.spec import ModelSpec


# torch 2.13 utils/checkpoint.py `checkpoint`'s keyword arguments that a JSON value can give (context_fn takes a
# callable), and preserve_rng_state, popped from its **kwargs; transformers 5.24 modeling_utils.py
# `_activation_checkpointing_enable` binds gradient_checkpointing_kwargs into that call
CHECKPOINT_KWARGS = frozenset({"use_reentrant", "determinism_check", "debug", "early_stop", "preserve_rng_state"})


@lru_cache(maxsize=1)
def exclusive_fields() -> dict[str, Any]:
    """TrainSpec fields that only some trainers' configs declare, with TrainSpec's default — the value that means "not
    used" — so that a default never trips the rule in `check_job`."""
    declared = [set(e.fields) for e in REGISTRY.values()]
    some = set.union(*declared) - set.intersection(*declared)
    return {f.name: f.default_factory() if f.default_factory is not MISSING else f.default
            for f in fields(TrainSpec) if f.name in some}


@lru_cache(maxsize=16)
def undeclared_fields(trainer: str) -> tuple[tuple[str, Any], ...]:
    """(field, unset value) of `exclusive_fields` that `trainer`'s config does not declare, in their order."""
    e = entry(trainer)
    return tuple((name, unset) for name, unset in exclusive_fields().items() if not e.declares(name))


def foreign_field(trainer: str, name: str) -> str:
    """Why `name`, a field of other trainers' configs, is refused for `trainer`: `trl <trainer>` hands a YAML key its
    parser does not know to `accelerate launch` (trl/cli/commands/training.py), which stops on it."""
    declared_by = [o for o in REGISTRY.values() if o.declares(name)]
    where = "/".join(o.config_class for o in declared_by)
    return (f"{name} is a {where} field; {entry(trainer).config_class} has no {name} field — remove it "
            f"or use `hpcmem estimate {declared_by[0].name}`")


def check_given_fields(trainer: str, given: Any) -> None:
    """The names the user wrote (TRL YAML, flags) that only other trainers' configs declare: refused whatever their
    value — at TrainSpec's default `check_job` cannot tell them from unset."""
    p = Problems()
    for name, _ in undeclared_fields(trainer):
        if name in given:
            p.add(foreign_field(trainer, name))
    p.raise_if_any()


def check_job(job: Job) -> None:
    t, par = job.train, job.parallel
    e = entry(t.trainer)
    p = Problems()
    for name, unset in undeclared_fields(t.trainer):
        if getattr(t, name) != unset:
            p.add(foreign_field(t.trainer, name))
    unknown = sorted(set(t.gradient_checkpointing_kwargs) - CHECKPOINT_KWARGS - {"selective"})
    if unknown:
        p.add(f"gradient_checkpointing_kwargs {', '.join(map(repr, unknown))}: transformers passes these keys to "
              f"torch.utils.checkpoint.checkpoint, which takes {', '.join(sorted(CHECKPOINT_KWARGS))} (and TRL's SFT "
              "selective) and stops the first training forward on anything else — remove them")
    if t.selective_checkpointing:
        # sft_trainer.py: the SAC wrapper strips `selective`; other trainers pass it to torch.utils.checkpoint.
        if e.name != "sft":
            p.add(f"gradient_checkpointing_kwargs selective is SFT-only in TRL 1.16; {e.config_class} "
                  "passes it to torch.utils.checkpoint, which rejects it — drop it")
        if not t.gradient_checkpointing:
            p.add("gradient_checkpointing_kwargs={'selective': True} requires gradient_checkpointing=True")
        if t.gradient_checkpointing_kwargs.get("use_reentrant"):
            p.add("selective checkpointing requires non-reentrant checkpointing: set use_reentrant False or unset it")
        if t.use_peft and par.deepspeed and par.zero_stage == 3:
            p.add("selective checkpointing is not supported with PEFT + DeepSpeed ZeRO-3 (it forces reentrant "
                  "checkpointing); use full checkpointing or another ZeRO stage")
        elif t.use_peft and e.name == "sft":
            # sft_trainer.py wraps the PeftModel's gradient_checkpointing_enable (selective_activation_checkpointing.py)
            # but transformers 5's Trainer calls activation_checkpointing_enable, which the PeftModel forwards to the
            # unwrapped base model: `selective` reaches torch.utils.checkpoint at the first forward
            p.add("selective checkpointing with PEFT dies at the first step in TRL 1.16 + transformers 5 (torch's "
                  "checkpoint raises 'Unexpected keyword arguments: selective': SFTTrainer wraps the PeftModel's "
                  "gradient_checkpointing_enable, transformers enables checkpointing on the base model); use full "
                  "checkpointing with use_peft")
    if t.use_peft:
        _check_lora_variants(job, p)
    _check_model_type(job, p)
    auto_class_problems(job, p)     # transformers' and peft's own refusals by model type (hpcmem.job.auto_classes)
    for problem in image_job_problems(job):     # a vision-language job's images (hpcmem.job.images)
        p.add(problem)
    if t.quantized and not t.use_peft:
        # transformers Trainer: "You cannot perform fine-tuning on purely quantized models".
        p.add("load_in_4bit/load_in_8bit train only adapters: add use_peft (QLoRA); transformers refuses to "
              "fine-tune a purely quantized model")
    trainer_rules = e.hook("rules")
    if trainer_rules is not None:
        trainer_rules(job, p)
    check_layout(job, p)            # context / sequence parallelism (hpcmem.job.mesh_rules)
    for model, setting in _auto_loads(job):
        if model.dtype is not None and model.dtype not in DTYPES:
            where = f"checkpoint's dtype (from {model.dtype_source})" if model.dtype_source else "config.json's dtype"
            p.add(f"dtype auto loads {model.name} in its {where} {model.dtype!r}; hpcmem estimates "
                  f"{', '.join(DTYPES)} weights only: {setting} one of them")
    p.raise_if_any()


def _auto_loads(job: Job) -> list[tuple[ModelSpec, str]]:
    """(model, what to set instead) for each model loaded with dtype auto: the policy, and distillation's teacher
    when its dtype (TrainSpec.teacher_dtype) is auto."""
    t = job.train
    out = [(job.model, "pass --dtype")] if t.dtype == "auto" else []
    if job.teacher is not None and t.teacher_dtype == "auto":
        own = (t.teacher_model_init_kwargs or {}).get("dtype")
        out.append((job.teacher, "set teacher_model_init_kwargs' dtype to" if own else "pass --dtype"))
    return out


def _check_model_type(job: Job, p: Problems) -> None:
    """Settings without which the type's real trainer raises (hpcmem/models/coverage.json "requires": TRL's or
    transformers' reason per type); a field left None takes the model config's value (a learned model's config)."""
    learned = job.model.learned
    for problem in requirement_problems(job.model.model_type, job.train, learned.config if learned else None):
        p.add(problem)
    for problem in rwkv_problems(job):
        p.add(problem)
    for problem in xlstm_problems(job.model.model_type, learned.config if learned else None):
        p.add(problem)
    for problem in xlstm_dtype_problems(job):
        p.add(problem)
    for problem in position_problems(job):      # a row past the model's position table (hpcmem.job.position_limits)
        p.add(problem)
    for problem in reentrant_graph_problems(job):   # a shared graph reentrant checkpointing frees (reentrant_rules)
        p.add(problem)


def _check_lora_variants(job: Job, p: Problems) -> None:
    """peft's own refusals (hpcmem.job.param_wrapper_rules, hpcmem.job.lora_linear_rules,
    hpcmem.job.all_linear_rules) and what hpcmem sizes
    (hpcmem.estimate.lora_variants)."""
    t = job.train
    if len(t.lora_target_modules) == 1 and t.lora_target_modules[0] != "all-linear":
        # trl/trainer/model_config.py ModelConfig.__post_init__ passes a one-element list on as its string, and peft
        # matches a string target as a regex against each module's whole path (peft/tuners/tuners_utils.py
        # check_target_module_exists → re.fullmatch): a bare name matches nothing and get_peft_model raises
        p.add(f"lora_target_modules {t.lora_target_modules[0]!r}: TRL 1.16 hands a single target to peft as a "
              "regex over the module's full path, which a bare name never matches (peft raises 'Target modules … not "
              "found'); name two or more modules (or the one twice: TRL keeps a two-name list), or all-linear")
    layers = [n for n in t.lora_target_modules if n.isdecimal() and int(n) < job.model.num_hidden_layers]
    if layers and len(t.lora_target_modules) > 1:
        # peft matches a listed target against every module whose path ends with ".<target>" (peft/tuners/
        # tuners_utils.py check_target_module_exists: key.endswith(f".{target_key}")); a number also names that
        # element of the decoder's layer list (model.layers.<n>), a decoder layer, which LoRA cannot wrap: peft/tuners/
        # lora/model.py `_create_new_module` raises "Target module … is not supported"
        p.add(f"lora_target_modules {', '.join(repr(n) for n in layers)}: peft matches a target against every module "
              f"path ending in it, and a number is also an element of the decoder's layer list (e.g. model.layers."
              f"{layers[0]}), which LoRA cannot wrap (peft raises 'Target module … is not supported'); name the "
              "linear by a path that only it ends with, or use all-linear")
    unsized = [n for n in t.lora_modules_to_save if n not in SIZED_MODULES]
    if unsized:
        p.add(f"lora_modules_to_save {', '.join(unsized)}: hpcmem sizes the trainable copies of "
              f"{', '.join(SIZED_MODULES)} only")
    for problem in (param_wrapper_problems(job) + linear_subclass_problems(job) + lora_task_problems(job)
                    + numbered_leaf_problems(job)):
        p.add(problem)


def check_sft(job: Job, p: Problems) -> None:
    """sft_trainer.py: padding_free without packing does not enforce max_length."""
    t = job.train
    if t.padding_free and not t.packing and t.max_length is not None:
        p.add("padding_free=True without packing does not enforce max_length (SFTTrainer raises): enable packing "
              "(packing=True, packing_strategy=bfd) or set max_length None (--max_length none) with pre-truncated data")


def check_generation(job: Job, p: Problems) -> None:
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
    if t.num_generations < 2:
        p.add(f"num_generations {t.num_generations}: {entry(t.trainer).config_class} requires at least 2 generations "
              "per prompt to compute the advantages (it raises); set num_generations ≥ 2")
    elif gen % t.num_generations:
        p.add(f"generation_batch_size {gen} must be divisible by num_generations {t.num_generations}")
    if t.use_vllm and not t.ds3_gather_for_generation and job.parallel.zero_stage == 3:
        p.add("ds3_gather_for_generation=False is not compatible with vLLM generation; keep it True or drop use_vllm")


# ModelConfig's LoRA fields, read by trl/trainer/utils.py get_peft_config only when use_peft is set
LORA_SETTINGS = ("lora_r", "lora_alpha", "lora_target_modules", "lora_dropout", "use_dora", "lora_modules_to_save",
                 "lora_target_parameters", "use_bnb_nested_quant")


def _default(name: str) -> Any:
    f = TrainSpec.__dataclass_fields__[name]
    return f.default_factory() if f.default_factory is not MISSING else f.default


def job_warnings(job: Job) -> list[str]:
    t = job.train
    e = entry(t.trainer)
    out: list[str] = []
    if t.padding_free and not e.packs:
        out.append(f"{e.trainer_class} 1.16 warns that padding_free is temporarily unavailable and falls back to "
                   "padding; estimated as padded")
    if t.packing and t.packing_strategy == "wrapped" and t.padding_free:
        out.append("padding_free with packing_strategy wrapped is not recommended by TRL (documents mix in a row)")
    if e.packs and t.padding_free and not t.packing and t.per_device_train_batch_size == 1:
        out.append("padding-free with per_device_train_batch_size 1 gains nothing (TRL warns); raise the batch size")
    if e.packs and (t.padding_free or (t.packing and t.packing_strategy != "wrapped")) and \
            "flash" not in t.attn_implementation:
        out.append(f"padding-free rows with attn_implementation={t.attn_implementation}: transformers builds a "
                   "block-diagonal mask; a FlashAttention variant avoids it")
    unreached = [n for n in t.lora_modules_to_save if n in SIZED_MODULES and reaches(job.model.model_type, n) is None]
    if t.use_peft and unreached:
        # peft/utils/other.py `_set_trainable`: modules whose path ends with a listed name, silently none
        out.append(f"lora_modules_to_save {', '.join(unreached)}: no module of {job.model.model_type} has a path "
                   f"ending in it ({actual_names(job.model.model_type)}), so peft copies nothing for it and the "
                   "estimate counts no trainable copy")
    inert = [name for name in LORA_SETTINGS if getattr(t, name) != _default(name)] if not t.use_peft else []
    if inert:
        # trl/trainer/utils.py get_peft_config: None unless use_peft, so the model is trained in full
        out.append(f"{', '.join(inert)} without use_peft: TRL builds no adapters and trains the full model; add "
                   "--use_peft true for LoRA")
    for model, setting in _auto_loads(job):
        if model.dtype is None:
            # spec.load_dtype: transformers then reads the checkpoint's first floating weight; hpcmem reads a local
            # folder's safetensors header (hpcmem.models.checkpoint), not a Hub checkpoint nor a .bin
            why = (f"hpcmem could not read it: {model.dtype_source}" if model.dtype_source else
                   "which hpcmem reads only from a local model folder's safetensors files")
            out.append(f"dtype auto: {model.name}'s config.json names no dtype, so transformers takes the first "
                       f"floating-point weight of the checkpoint, {why}; estimated as bfloat16 "
                       f"(a float32 checkpoint holds twice the weight bytes): {setting} float32 or bfloat16")
    cc = job.gpu.compute_capability if job.gpu else ""
    if t.bf16 and re.fullmatch(r"\d+\.\d+", cc) and float(cc) < 8.0:
        # torch/cuda/__init__.py is_bf16_supported: major ≥ 8 natively, else only if a bf16 tensor can be made
        # (emulation), which transformers' TrainingArguments accepts; bf16 Tensor Cores came with Ampere (sm_80)
        out.append(f"bf16 on {job.gpu.name} (compute capability {cc}): no bf16 Tensor Cores, torch emulates bf16 — "
                   "memory as estimated, speed at most the fp32 rate (the planner ranks with it); --fp16 true uses "
                   "its fp16 Tensor Cores")
    if t.attn_implementation not in ("eager", "sdpa") and "flash" not in t.attn_implementation:
        # hpcmem.estimate.activations keeps eager's scores, FlashAttention's and SDPA's q, k, v, out and logsumexp
        out.append(f"attn_implementation {t.attn_implementation} is estimated as SDPA keeps its tensors; hpcmem has "
                   "not traced this kernel")
    if job.trl_forces_reentrant:
        out.append("PEFT + ZeRO-3 forces reentrant gradient checkpointing (TRL sets use_reentrant=True)")
    if job.parallel.distributed_type == "NO" and job.parallel.num_machines > 1:
        out.append("num_machines > 1 without a distributed type")
    return out + layout_warnings(job)

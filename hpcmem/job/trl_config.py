"""Read what a TRL user already has — the YAML given to `trl <trainer> --config`, an accelerate config — into specs.

Precedence: TRL 1.16 defaults < preset < the user's TRL YAML < CLI flags. Keys are TRL's own field names; keys
hpcmem does not model are listed back to the user as ignored, never silently dropped. Trainer-specific defaults come
from trl/trainer/*_config.py (1.16), kept in each trainer's registry entry (hpcmem.job.trainers).
"""

from __future__ import annotations

import os
from dataclasses import fields
from typing import Any

from hpcmem.errors import HpcmemError, SpecError
from hpcmem.gpus.lookup import gpu_spec
from hpcmem.inputs.files import exists, is_file, load_yaml_file
from hpcmem.inputs.values import json_object, shown
from hpcmem.job.accelerate_blocks import READ as ACCELERATE_BLOCKS
from hpcmem.job.accelerate_blocks import block_settings
from hpcmem.job.accelerate_keys import check_accelerate_keys
from hpcmem.job.accelerator_config import accumulation_settings, read_accelerator_config
from hpcmem.job.assumptions import assumed_names
from hpcmem.job.job_env import JobEnv
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.mesh_rules import check_layout_settings
from hpcmem.job.model_init import apply_model_init_kwargs
from hpcmem.job.parallelism import PREFIX as PARALLELISM_PREFIX
from hpcmem.job.parallelism import parallelism_settings, reshard_after_forward
from hpcmem.job.settings import check_settings
from hpcmem.job.spec import ParallelSpec, TrainSpec
from hpcmem.job.trainers import entry
from hpcmem.job.trainers.field_types import type_problem
from hpcmem.job.trainers.fields import check_fields
from hpcmem.models import resolve_model
from hpcmem.models.coverage import required_settings

# TRL's shipped accelerate configs (trl/accelerate_configs/*.yaml, 1.16), by the name `trl --accelerate_config` takes.
SHIPPED_ACCELERATE = {
    "single_gpu": {"distributed_type": "NO"},
    "multi_gpu": {"distributed_type": "MULTI_GPU"},
    "zero1": {"distributed_type": "DEEPSPEED", "zero_stage": 1},
    "zero2": {"distributed_type": "DEEPSPEED", "zero_stage": 2},
    "zero3": {"distributed_type": "DEEPSPEED", "zero_stage": 3},
    "fsdp1": {"distributed_type": "FSDP", "fsdp_version": 1},
    "fsdp2": {"distributed_type": "FSDP", "fsdp_version": 2},
}
TRAIN_FIELDS = {f.name for f in fields(TrainSpec)} - {"trainer"}
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")     # torch.compile modes that use CUDA graphs
PARALLEL_FIELDS = {f.name for f in fields(ParallelSpec)}
# Settings that live outside TrainSpec but in the same YAML / flag namespace.
JOB_FIELDS = {"model_name_or_path", "expandable_segments", "gpu", "tokens_per_micro_batch",
              "label_tokens_per_micro_batch", "accelerate_config"}   # accelerate_config: `trl --accelerate_config`, applied by the CLI before build_job


def read_yaml(path: str | os.PathLike, what: str = "config") -> dict[str, Any]:
    """A YAML mapping read within hpcmem.inputs.files' limits (size, UTF-8, nesting, aliases); keys are not checked
    here (hpcmem.job.settings does, naming the file)."""
    if not is_file(path):
        raise HpcmemError(f"{what} file {path} " + ("is not a regular file" if exists(path) else "does not exist"))
    data = load_yaml_file(path, what)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise HpcmemError(f"{what} {path} must hold a mapping of field names to values, got {type(data).__name__}")
    return data


def accelerate_settings(name_or_path: str) -> dict[str, Any]:
    """ParallelSpec fields from a shipped config name or an accelerate YAML file (accelerate's own key names)."""
    if name_or_path in SHIPPED_ACCELERATE:
        return dict(SHIPPED_ACCELERATE[name_or_path])
    if not is_file(name_or_path):
        raise HpcmemError(f"--accelerate_config {shown(name_or_path)} is neither a shipped TRL config "
                          f"({', '.join(SHIPPED_ACCELERATE)}) nor a file")
    raw = read_yaml(name_or_path, "accelerate config")
    check_accelerate_keys(raw, f"accelerate config {name_or_path}")
    if raw.get("distributed_type") is False:      # YAML 1.1 (PyYAML, accelerate's loader too) reads bare NO as false
        raise HpcmemError(f"accelerate config {name_or_path}: distributed_type is false — YAML reads a bare NO as "
                          "false; write distributed_type: 'NO' (quoted, as `accelerate config` writes it)")
    out: dict[str, Any] = {k: raw[k] for k in ("distributed_type", "num_processes", "num_machines") if k in raw}
    for engine, block in (("DEEPSPEED", "deepspeed_config"), ("FSDP", "fsdp_config")):
        section = raw.get(block) or {}
        if not isinstance(section, dict):
            raise HpcmemError(f"accelerate config {name_or_path}: {block} must be a mapping of accelerate keys; "
                              f"got {shown(section)}")
        if "distributed_type" in raw and raw["distributed_type"] != engine:
            continue    # accelerate launches by distributed_type and leaves the other engine's block unread
        out.update(block_settings(block, section, f"accelerate config {name_or_path}"))
    if out.get("distributed_type") == "FSDP" and "fsdp_version" not in out:
        out["fsdp_version"] = 1     # accelerate launch's --fsdp_version default (commands/launch.py), not hpcmem's 2
    if out.get("distributed_type") == "DEEPSPEED" and "zero_stage" not in out:
        # accelerate utils/dataclasses.py DeepSpeedPlugin.__post_init__: no zero_stage in the file → stage 2
        out["zero_stage"] = 2
    if "fsdp_reshard_after_forward" in out:
        out["fsdp_reshard_after_forward"] = reshard_after_forward(
            out["fsdp_reshard_after_forward"], out.get("fsdp_version", 1), f"accelerate config {name_or_path}")
    out.update(parallelism_settings(raw.get("parallelism_config"), f"accelerate config {name_or_path}",
                                    raw.get("distributed_type")))
    return check_settings(out, f"accelerate config {name_or_path}")


def _normalise(settings: dict[str, Any]) -> dict[str, Any]:
    out = dict(settings)
    apply_model_init_kwargs(out)
    if out.get("dtype") is None and "dtype" in out:
        out["dtype"] = "float32"
    if isinstance(out.get("gradient_checkpointing_kwargs"), str):
        out["gradient_checkpointing_kwargs"] = json_object("gradient_checkpointing_kwargs",
                                                           out["gradient_checkpointing_kwargs"])
    if out.get("gradient_checkpointing_kwargs") is None and "gradient_checkpointing_kwargs" in out:
        out["gradient_checkpointing_kwargs"] = {}
    for name in ("lora_target_modules", "lora_modules_to_save", "lora_target_parameters"):
        names = out.get(name)
        if isinstance(names, str):
            names = [names]
        if isinstance(names, (list, tuple)):       # YAML list, one string, or repeated flags
            out[name] = tuple(x.strip() for item in names for x in str(item).split(",") if x.strip())
        elif name in out and names is None:        # TRL's default None: peft's own choice / nothing
            out[name] = ()
    if out.get("bf16") is None and ("bf16" in out or "fp16" in out):
        # TRL's bf16 None (its default) becomes `not fp16` (trl/trainer/base_config.py __post_init__)
        out["bf16"] = not out.get("fp16", False)
    if out.get("attn_implementation") is None and "attn_implementation" in out:
        out["attn_implementation"] = "sdpa"
    if "accelerator_config" in out:
        out["accelerator_config"] = read_accelerator_config(out["accelerator_config"])
        out.update(accumulation_settings(out["accelerator_config"], out))
    _aliases(out)
    return out


def _aliases(out: dict[str, Any]) -> None:
    """TrainingArguments' own resolution (transformers training_args.py `__post_init__`): activation_checkpointing*
    win over their deprecated gradient_checkpointing* aliases when set; a torch_compile_backend or _mode turns
    torch_compile on; a max_grad_norm of None means no clipping."""
    for new, old in (("activation_checkpointing", "gradient_checkpointing"),
                     ("activation_checkpointing_kwargs", "gradient_checkpointing_kwargs")):
        if out.get(new) is not None:
            value = out[new]
            out[old] = json_object(new, value) if new.endswith("kwargs") and isinstance(value, str) else value
    if out.get("torch_compile_backend") or out.get("torch_compile_mode"):
        out["torch_compile"] = True
    if out.get("torch_compile_mode") in CUDA_GRAPH_MODES:
        raise SpecError(f"torch_compile_mode={out['torch_compile_mode']!r} is refused: it captures CUDA graphs, whose "
                        "static copies of the graph's inputs and outputs hpcmem does not model (use 'default' or "
                        "'max-autotune-no-cudagraphs')")
    if "max_grad_norm" in out and out["max_grad_norm"] is None:
        out["max_grad_norm"] = 0.0


# knobs the planner searches that a model type may require (hpcmem/models/coverage.json "requires"): a plan of
# such a type starts from the value its real trainer runs with, when the user left the knob unset
PLANNER_SETTLES = ("gradient_checkpointing",)


def build_job(trainer: str, settings: dict[str, Any], *, model=None, gpu=None,
              settle_required: bool = False, job_env: JobEnv | None = None) -> tuple[JobSpec, list[str]]:
    """Settings (already merged by precedence) → JobSpec, plus the names hpcmem ignored (no memory effect modelled).
    `settle_required` (the planner): a knob of PLANNER_SETTLES the settings leave unset takes the value the model
    type's real trainer requires, instead of TRL's default that the type refuses. `job_env`: what the job's
    environment changes (hpcmem.job.job_env.read_env; its expandable_segments already in `settings`)."""
    s = _normalise(check_settings(settings, "settings"))
    e = entry(trainer)
    not_read = check_fields(e.config_class, {k: v for k, v in s.items() if k not in TRAIN_FIELDS | PARALLEL_FIELDS},
                            own=JOB_FIELDS | {k for k in s if k.startswith((PARALLELISM_PREFIX.rstrip("_"),
                                                                             *ACCELERATE_BLOCKS))},
                            script_class=e.script_class)
    defaults = e.defaults
    train_kw = {**defaults, **{k: v for k, v in s.items() if k in TRAIN_FIELDS}}
    par_kw = {k: v for k, v in s.items() if k in PARALLEL_FIELDS}
    if par_kw.get("num_processes", 1) > 1 and "distributed_type" not in par_kw:
        par_kw["distributed_type"] = "MULTI_GPU"
    ignored = sorted(k for k in not_read if k not in JOB_FIELDS)
    refused = [why for why in (type_problem(trainer, k, s[k]) for k in ignored) if why]
    if refused:
        raise SpecError(refused)
    if model is None:
        name = s.get("model_name_or_path")
        if not name:
            raise SpecError("model_name_or_path is required (a catalog id such as Qwen/Qwen2.5-7B, a config.json, "
                            "or a folder holding one; see `hpcmem models list`)")
        model = resolve_model(str(name))
    teacher = resolve_model(str(s["teacher_model_name_or_path"])) if s.get("teacher_model_name_or_path") else None
    if gpu is None and s.get("gpu"):
        gpu = gpu_spec(str(s["gpu"]))
    if settle_required:
        required = required_settings(model.model_type)
        train_kw.update({k: required[k] for k in PLANNER_SETTLES if k in required and k not in s})
    try:
        job = JobSpec(model=model, train=TrainSpec(trainer=trainer, **train_kw), parallel=ParallelSpec(**par_kw),
                      gpu=gpu, expandable_segments=bool(s.get("expandable_segments", False)),
                      tokens_per_micro_batch=s.get("tokens_per_micro_batch"),
                      label_tokens_per_micro_batch=s.get("label_tokens_per_micro_batch"), teacher=teacher,
                      assumed=assumed_names(trainer, s, s.get("tokens_per_micro_batch")), env=job_env or JobEnv())
    except TypeError as exc:
        raise SpecError(f"invalid setting: {exc}") from None
    check_layout_settings(s, job)       # TRL fields outside the spec that a layout refuses (hpcmem.job.mesh_rules)
    return job, ignored

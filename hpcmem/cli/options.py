"""The job flags shared by estimate, trace, probe, plan and submit — generated from the specs, so a setting has one
name everywhere (TRL's field name; `--max_length` and `--max-length` both work). Every flag defaults to "not given",
which lets `job_from_cli` apply the precedence: TRL defaults < preset < --config YAML < flags.
"""

from __future__ import annotations

from dataclasses import MISSING, fields
from collections.abc import Mapping
from typing import Any, Callable

import click

from hpcmem.data.errors import ProfileError
from hpcmem.errors import HpcmemError, SpecError
from hpcmem.inputs.values import json_object
from hpcmem.job.images import FIELD_HELP as IMAGE_FIELD_HELP
from hpcmem.job.job_env import JobEnv, read_env, with_env_settings
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.rules import check_given_fields
from hpcmem.job.settings import check_settings
from hpcmem.job.spec import ParallelSpec, TrainSpec
from hpcmem.job.trainers import REGISTRY, entry, names
from hpcmem.job.trainers.defaults import shown, trl_defaults
from hpcmem.job.trl_config import accelerate_settings, build_job, read_yaml


def typed(name: str) -> bool:
    """Whether the user typed option `name` on the command line (not its default, nor a config file's value)."""
    return click.get_current_context().get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE


TRAINER_ARG = click.argument("trainer", type=click.Choice(names()))
ENV_HELP = ("NAME=VALUE exported in the job (repeatable), over the preset's env; what changes GPU memory "
            "(PYTORCH_ALLOC_CONF, NCCL_NVLS_ENABLE, CUBLAS_WORKSPACE_CONFIG…) is read into the estimate")
ENV_WHERE = "the job's environment (the preset's env and --env)"


def env_pairs(values: tuple[str, ...] | list[str]) -> dict[str, str]:
    """--env NAME=VALUE … → {NAME: VALUE}, later wins."""
    out = {}
    for item in values:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise HpcmemError(f"--env {item!r}: expected NAME=VALUE")
        out[name] = value
    return out


class _OptionalBool(click.ParamType):
    name = "[true|false]"

    def convert(self, value, param, ctx):
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
        self.fail(f"{value!r} is not a boolean (true/false)", param, ctx)


class _Unset:
    """What `--max_length none` parses to: an explicit None, told apart from "flag not given"."""

    def __repr__(self) -> str:
        return "none"


EXPLICIT_NONE = _Unset()


class _OptionalInt(click.ParamType):
    name = "INT|none"

    def convert(self, value, param, ctx):
        if value is None or isinstance(value, int):
            return value
        if value is EXPLICIT_NONE or str(value).lower() in ("none", "null"):
            return EXPLICIT_NONE
        try:
            return int(value)
        except ValueError:
            self.fail(f"{value!r} is not an integer or 'none'", param, ctx)


class _Json(click.ParamType):
    name = "JSON"

    def convert(self, value, param, ctx):
        try:
            return json_object(param.opts[0] if param is not None else "value", value)
        except SpecError as exc:
            self.fail(f"{'; '.join(exc.problems)}; e.g. '{{\"selective\": true}}'", param, ctx)


def _param_type(name: str, default: Any) -> click.ParamType | type:
    if isinstance(default, bool):
        return _OptionalBool()
    if name in ("max_length", "pad_to_multiple_of", "steps_per_generation", "generation_batch_size", "min_pixels",
                "max_pixels"):
        return _OptionalInt()
    if isinstance(default, int):
        return int
    if isinstance(default, float):
        return float
    if name.endswith("_kwargs"):                # gradient_checkpointing_kwargs, teacher_model_init_kwargs
        return _Json()
    return str


def _default_of(f) -> Any:
    return f.default_factory() if f.default_factory is not MISSING else f.default


def _default_help(name: str, default: Any) -> str:
    """The field's default as each trainer's config has it (the registry's defaults, else TrainSpec's): one value when
    every trainer that declares the field agrees, else the value per trainer."""
    values = {e.name: e.defaults.get(name, default) for e in REGISTRY.values() if e.declares(name)}
    if len(set(map(repr, values.values()))) <= 1:
        return f"(default {next(iter(values.values()), default)!r})"
    return "(default " + ", ".join(f"{trainer} {value!r}" for trainer, value in values.items()) + ")"


def _trainer_default_help(name: str, default: Any, trainer: str) -> str:
    """The field's default under `trl <trainer>` (`hpcmem estimate <trainer> --help`)."""
    e = entry(trainer)
    if e.declares(name):
        default = e.defaults.get(name, default)
    elif any(other.declares(name) for other in REGISTRY.values()):
        return f"(not a field of trl {trainer}: refused)"
    declared = trl_defaults(trainer).get(name, default)
    if declared == default or (declared is None and default in ((), {})):
        return f"(default {default!r})"
    # bf16 None → not fp16 (TrainingArguments.__post_init__), pad_to_multiple_of "auto" → None off Neuron
    # (SFTConfig.__post_init__), attn_implementation None → transformers' sdpa (PreTrainedModel's default)
    return f"(default {default!r}: TRL's field says {shown(declared)}, which resolves to it)"


class SpecOption(click.Option):
    """A spec field's flag whose help shows the default of the trainer named on the command line (TrlCommand puts
    it in ctx.meta["trl_trainer"]), or every trainer's where none is named."""

    def __init__(self, decls: list[str], *, field_default: Any, **kw: Any) -> None:
        super().__init__(decls, **kw)
        self.field_default = field_default

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        record = super().get_help_record(ctx)
        trainer = ctx.meta.get("trl_trainer")
        if record is None or trainer is None or not (self.help or "").startswith("(default "):
            return record
        return record[0], _trainer_default_help(self.name or "", self.field_default, trainer)


def spec_options() -> list[click.Option]:
    out = []
    for cls in (TrainSpec, ParallelSpec):
        for f in fields(cls):
            if f.name == "trainer":
                continue
            default = _default_of(f)
            ptype = _param_type(f.name, default)
            kw: dict[str, Any] = {"default": None, "show_default": False, "help": _default_help(f.name, default)}
            if isinstance(ptype, _OptionalBool):
                kw.update(is_flag=False, flag_value="true")
            if f.name in IMAGE_FIELD_HELP:
                kw["help"] = IMAGE_FIELD_HELP[f.name]
            if f.name == "lora_target_modules":
                kw.update(multiple=True, help="module names (repeat or comma-separate); all-linear; "
                                               "default: peft's per-architecture choice")
            decls = [f"--{f.name}"] + ([f"--{f.name.replace('_', '-')}"] if "_" in f.name else [])
            out.append(SpecOption(decls + [f.name], type=ptype, field_default=default, **kw))
    return out


def job_options(func: Callable) -> Callable:
    """Add every job flag to a click command (its callback receives them as keyword arguments)."""
    extra = [
        click.Option(["--config", "config"], type=click.Path(dir_okay=False), default=None,
                     help="the YAML you pass to `trl <trainer> --config`"),
        click.Option(["--accelerate_config", "--accelerate-config", "accelerate_config"], default=None,
                     help="zero1|zero2|zero3|fsdp1|fsdp2|multi_gpu|single_gpu or an accelerate YAML"),
        click.Option(["--model_name_or_path", "--model-name-or-path", "model_name_or_path"], default=None,
                     help="catalog id (hpcmem models list), config.json or folder"),
        click.Option(["--gpu", "gpu"], default=None, help="GPU model for the fit verdict (hpcmem gpus)"),
        click.Option(["--expandable_segments", "--expandable-segments", "expandable_segments"], type=_OptionalBool(),
                     is_flag=False, flag_value="true", default=None,
                     help="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in the job"),
        click.Option(["--lengths", "lengths"], type=click.Path(dir_okay=False), default=None,
                     help="length profile from `hpcmem lengths --save` (worst micro-batch from real data)"),
    ]
    func.__click_params__ = list(getattr(func, "__click_params__", [])) + list(reversed(spec_options() + extra))
    return func


def collect(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The flags the user actually gave, with 'none' turned into None (values are normalised by trl_config), and the
    TRL fields read from the command line beside them (hpcmem.cli.trl_argv: `trl_flags`)."""
    out = {}
    for key, value in kwargs.items():
        if key == "trl_flags" or value is None or value == ():
            continue
        out[key] = None if value is EXPLICIT_NONE else value
    for key, value in (kwargs.get("trl_flags") or {}).items():
        out.setdefault(key, value)
    return out


def job_from_cli(trainer: str, kwargs: dict[str, Any], preset: dict[str, Any] | None = None, *,
                 model: Any = None, settle_required: bool = False,
                 env: Mapping[str, str] | None = None) -> tuple[JobSpec, list[str]]:
    """Merge defaults < preset < --config YAML < flags, then build and validate the JobSpec (`settle_required`: the
    planner's start, hpcmem.job.trl_config.build_job). `env`: the variables the job runs with (the preset's env,
    then --env), read for their memory effects (hpcmem.job.job_env)."""
    given = collect(kwargs)
    config_path = given.pop("config", None)
    accel = given.pop("accelerate_config", None)
    lengths_path = given.pop("lengths", None)
    settings: dict[str, Any] = check_settings(preset or {}, "preset defaults")
    written = set(given)        # what the user wrote, not the preset's defaults shared by every trainer
    if config_path:
        yaml_settings = read_yaml(config_path)
        settings.update(check_settings(yaml_settings, f"config {config_path}"))
        written |= set(yaml_settings)
        if preset and "gpu" in preset:          # the job runs on the preset's GPU, whatever the YAML's `gpu:` says
            settings["gpu"] = preset["gpu"]     # (as hpcmem.launch.submission.prepare runs it); --gpu still applies
    if accel:
        settings.update(accelerate_settings(accel))
    elif settings.get("accelerate_config"):
        settings.update(accelerate_settings(settings["accelerate_config"]))
    settings.pop("accelerate_config", None)
    settings.update(check_settings(given, "command line"))
    vision = _apply_profile(lengths_path, trainer, settings) if lengths_path else None
    check_given_fields(trainer, written)
    job_env = read_env(env, ENV_WHERE) if env else JobEnv()
    settings = with_env_settings(settings, job_env, ENV_WHERE)
    job, notes = build_job(trainer, settings, model=model, settle_required=settle_required, job_env=job_env)
    if vision is not None:
        _check_processor(vision, lengths_path, job)
    return job, notes


def _check_processor(vision: dict, path: str, job: JobSpec) -> None:
    """An image-text profile counts what its processor made: the model's vision tower must cut images the same way
    (the Qwen2-VL grid: patch_size and merge_size), else its patches and image tokens are another model's."""
    v = job.model.vision
    if v is None:
        return      # refused by the job's rules (hpcmem.job.image_rules): the model has no vision tower
    if vision.get("family") != "grid" or (vision.get("patch_size"), vision.get("merge_size")) != \
            (v.patch_size, v.spatial_merge_size):
        raise ProfileError(f"the length profile {path} was made with a {vision.get('family')} processor (patch_size "
                           f"{vision.get('patch_size')}, merge_size {vision.get('merge_size')}); {job.model.name} cuts "
                           f"images into patch_size {v.patch_size}, merge_size {v.spatial_merge_size}: profile the data "
                           "with this model's processor")



def _apply_profile(path: str, trainer: str, settings: dict[str, Any]) -> dict | None:
    """--lengths: the worst micro-batch's tokens (tokens_per_micro_batch), or for a trainer that generates its
    completions the longest prompt (max_prompt_length, hpcmem's own field)."""
    from hpcmem.data.profile import (  # deferred: --lengths only
        label_tokens_per_micro_batch,
        load_profile,
        longest_prompt,
        tokens_per_micro_batch,
    )

    profile = load_profile(path)
    if profile.get("vision") is not None and trainer != "sft":
        raise ProfileError(f"--lengths {path} is an image-text profile: hpcmem models images for SFT only "
                           f"({trainer} with images is not modelled yet)")
    if entry(trainer).generates:
        longest = longest_prompt(profile, trainer)
        if "max_prompt_length" in settings:
            raise ProfileError(f"max_prompt_length {settings['max_prompt_length']} and --lengths {path} both set the "
                               f"longest prompt (the profile's is {longest}); give one of them")
        if longest < 1:
            raise ProfileError(f"the length profile {path} holds no prompt")
        settings["max_prompt_length"] = longest
        return
    tokens = tokens_per_micro_batch(
        profile, trainer=trainer,
        max_length=settings.get("max_length", 1024),
        per_device_train_batch_size=settings.get("per_device_train_batch_size", 8),
        packing=bool(settings.get("packing", False)),
        packing_strategy=settings.get("packing_strategy", "bfd"),
        padding_free=bool(settings.get("padding_free", False)),
        pad_to_multiple_of=settings.get("pad_to_multiple_of"),
    )
    if tokens < 1:
        raise ProfileError(f"the length profile {path} leaves no row to train on with these settings (no examples, "
                           "or every one dropped by max_length)")
    settings["tokens_per_micro_batch"] = tokens
    labels = label_tokens_per_micro_batch(profile, trainer=trainer, max_length=settings.get("max_length", 1024),
                                          per_device_train_batch_size=settings.get("per_device_train_batch_size", 8))
    if labels is not None:
        settings["label_tokens_per_micro_batch"] = labels
    if profile.get("vision") is not None:
        _apply_images(profile, path, settings)
    return profile.get("vision")


def _apply_images(profile: dict, path: str, settings: dict[str, Any]) -> None:
    """An image-text profile (hpcmem.lengths/2): its worst micro-batch's images, patches and image tokens, and
    TRL's refusal when max_length cuts into an example's image tokens."""
    from hpcmem.data.profile import image_cut, vision_per_micro_batch  # deferred: --lengths only

    given = [k for k in ("profile_images", "profile_patches", "profile_image_tokens") if k in settings]
    if given:
        raise ProfileError(f"{', '.join(given)} and --lengths {path} both give the images' counts (the profile's "
                           "worst micro-batch); give one of them")
    max_length = settings.get("max_length", 1024)
    cut = image_cut(profile, max_length)
    if cut:
        # processing_utils.py ProcessorMixin._check_special_mm_tokens: truncation that cuts image tokens raises
        raise ProfileError(f"max_length {max_length} cuts into the image tokens of {cut} example(s) of {path}; the "
                           "processor raises then ('Image features and image tokens do not match'): raise max_length "
                           "or lower max_pixels")
    # the profile counted what its processor made at its own bounds: a run (and its estimate) must resize the same way
    vision = profile.get("vision") or {}
    for name in ("min_pixels", "max_pixels"):
        made = vision.get(name)
        if made is None:
            continue
        if settings.get(name) is not None and settings[name] != made:
            raise ProfileError(f"{name} {settings[name]} differs from the {made} the length profile {path} was made "
                               f"with; its image counts hold at {made} only: profile the data again with --{name} "
                               f"{settings[name]}, or drop --{name}")
        settings[name] = made
    counts = vision_per_micro_batch(profile, per_device_train_batch_size=settings.get("per_device_train_batch_size", 8))
    settings.update(profile_images=counts.get("images", 0), profile_patches=counts.get("patches", 0),
                    profile_image_tokens=counts.get("image_tokens", 0))


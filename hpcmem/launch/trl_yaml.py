"""Pure renderer: the TRL YAML a job runs with = the user's own fields + the spec's values + hpcmem's choices.

A spec field is written when the user's YAML names it or when the spec's value differs from the spec default (it was
chosen: on the command line, by a preset, by the planner). Fields the trainer's config class does not declare are
never written, because `TrlParser` turns unknown YAML keys into extra `accelerate launch` arguments (`trl sft`) or
drops them (`python -m trl.scripts.sft`). The fields are TRL 1.16's, as each trainer's registry entry declares them
(hpcmem.job.trainers); tests/launch/test_launch_parsers.py pins them against the installed dataclasses.
"""

from __future__ import annotations

from dataclasses import MISSING, fields
from typing import TYPE_CHECKING, Any, Mapping

from hpcmem.job.spec import TrainSpec
from hpcmem.job.trainers import MODEL_CONFIG_FIELDS, entry

if TYPE_CHECKING:
    from hpcmem.job.jobspec import JobSpec

# Names that belong to hpcmem/accelerate, not to TRL: removed from a user's TRL YAML before it is written.
HPCMEM_ONLY = ("profile_images", "profile_patches", "profile_image_tokens",
               "gpu", "accelerate_config", "lengths", "max_prompt_length", "expandable_segments", "tokens_per_micro_batch",
               "label_tokens_per_micro_batch", "num_processes", "num_machines",
               "distributed_type", "zero_stage", "offload_optimizer_device", "offload_param_device", "fsdp_version",
               "fsdp_offload_params", "fsdp_reshard_after_forward", "zero3_init_flag", "zero3_save_16bit_model",
               "fsdp_state_dict_type", "fsdp_cpu_ram_efficient_loading", "zero_bucket_sizes",
               # the images' description (hpcmem.job.images): the dataset and the processor's preprocessor_config.json
               # carry them in a real run; TRL 1.16's SFTConfig has no such fields
               "images_per_example", "image_height", "image_width", "min_pixels", "max_pixels")
DEFAULT_OUTPUT_SUBDIR = "output"


def trl_fields(trainer: str) -> tuple[str, ...]:
    """The spec fields that `trl.scripts.<trainer>` reads (its config class + ModelConfig)."""
    return entry(trainer).fields + MODEL_CONFIG_FIELDS


def _plain(value: Any) -> Any:
    if value == ("all-linear",):
        return "all-linear"          # peft's special value is a string; ["all-linear"] would name a module
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _same(user_value: Any, spec_value: Any) -> bool:
    if isinstance(user_value, str) and isinstance(spec_value, tuple):
        return tuple(x.strip() for x in user_value.split(",") if x.strip()) == spec_value
    if isinstance(user_value, list):
        return tuple(user_value) == spec_value
    return user_value == spec_value


def trl_config(job: JobSpec, user_fields: Mapping[str, Any], *, output_dir: str) -> dict[str, Any]:
    """The resolved TRL YAML as a dict. `output_dir` is used when the user's YAML has none (checkpoints land there)."""
    defaults = {f.name: f.default_factory() if f.default_factory is not MISSING else f.default
                for f in fields(TrainSpec)}
    out = {k: v for k, v in user_fields.items() if k not in HPCMEM_ONLY}
    for name in trl_fields(job.train.trainer):
        value = getattr(job.train, name)
        if name in out and _same(out[name], value):
            continue                 # the user's own spelling of the same value ("all-linear", "q_proj,v_proj")
        if name in out or value != defaults.get(name):
            out[name] = _plain(value)
    out.setdefault("output_dir", output_dir)
    return out


def output_dir_of(config: Mapping[str, Any]) -> str:
    return str(config["output_dir"])

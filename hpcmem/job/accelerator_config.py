"""TrainingArguments.accelerator_config read as transformers reads it, for the two keys that change memory.

transformers (training_args.py `__post_init__`) takes the field as a mapping, as JSON text starting with "{", or as the
path of a JSON file (trainer_pt_utils.py `AcceleratorConfig.from_json_file`), and builds `AcceleratorConfig` from it,
refusing unknown keys. Its `gradient_accumulation_kwargs` become accelerate's `GradientAccumulationPlugin`
(trainer.py `create_accelerator_and_postprocess`), where two keys matter for memory:
- `num_steps`: taken as gradient_accumulation_steps when that is 1; with both set above 1, the Trainer raises;
- `sync_each_batch`: the Trainer then reduces gradients on every micro-batch (trainer.py `_inner_training_loop`), so
  FSDP keeps them sharded between micro-batches instead of unsharded (hpcmem.estimate.states
  `accumulated_gradients`).
The rest (split_batches, dispatch_batches, even_batches, use_seedable_sampler, non_blocking, use_configured_state;
adjust_scheduler, sync_with_dataloader) hand each rank the same micro-batch: no memory effect.
"""

from __future__ import annotations

import json
from typing import Any

from hpcmem.errors import SpecError
from hpcmem.inputs.files import read_text
from hpcmem.inputs.values import MAX_COUNT, json_object

# transformers trainer_pt_utils.py `AcceleratorConfig`'s fields; accelerate utils/dataclasses.py
# `GradientAccumulationPlugin`'s
KEYS = ("split_batches", "dispatch_batches", "even_batches", "use_seedable_sampler", "non_blocking",
        "gradient_accumulation_kwargs", "use_configured_state")
ACCUMULATION_KEYS = ("num_steps", "adjust_scheduler", "sync_with_dataloader", "sync_each_batch")
FIELD = "accelerator_config"


def names_a_file(value: Any) -> bool:
    """The field given as a path (transformers reads a string not starting with "{" as a JSON file's)."""
    return isinstance(value, str) and not value.lstrip().startswith("{")


def read_accelerator_config(value: Any) -> dict[str, Any]:
    """The field's mapping ({} for None), checked: known keys only, gradient_accumulation_kwargs a mapping of known
    keys, num_steps a positive integer and sync_each_batch a boolean. One-line SpecError otherwise."""
    if value is None:
        return {}
    if names_a_file(value):
        try:
            text = read_text(value, "config")
        except SpecError as exc:
            raise SpecError(f"{FIELD} {value!r}: not JSON text starting with '{{' nor a JSON file "
                            f"({'; '.join(exc.problems)})") from None
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise SpecError(f"{FIELD} {value!r}: not a JSON file ({exc})") from None
    config = json_object(FIELD, value)
    unknown = sorted(set(config) - set(KEYS))
    if unknown:
        raise SpecError(f"{FIELD}: unknown key(s) {', '.join(map(repr, unknown))}; transformers' AcceleratorConfig "
                        f"has {', '.join(KEYS)}")
    kwargs = config.get("gradient_accumulation_kwargs")
    if kwargs is None:
        return config
    if not isinstance(kwargs, dict):
        raise SpecError(f"{FIELD} gradient_accumulation_kwargs {kwargs!r}: a mapping of "
                        f"{', '.join(ACCUMULATION_KEYS)}")
    unknown = sorted(set(kwargs) - set(ACCUMULATION_KEYS))
    if unknown:
        raise SpecError(f"{FIELD} gradient_accumulation_kwargs: unknown key(s) {', '.join(map(repr, unknown))}; "
                        f"accelerate's GradientAccumulationPlugin has {', '.join(ACCUMULATION_KEYS)}")
    steps = kwargs.get("num_steps")
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= MAX_COUNT):
        raise SpecError(f"{FIELD} gradient_accumulation_kwargs num_steps {steps!r}: a positive integer ≤ {MAX_COUNT}, "
                        "as gradient_accumulation_steps")
    sync = kwargs.get("sync_each_batch", False)
    if not isinstance(sync, bool):
        raise SpecError(f"{FIELD} gradient_accumulation_kwargs sync_each_batch {sync!r}: true or false")
    return config


def accumulation_settings(config: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    """gradient_accumulation_steps as the Trainer resolves it with the config's num_steps (module docstring): {} when
    the config does not change it."""
    steps = (config.get("gradient_accumulation_kwargs") or {}).get("num_steps")
    if steps is None:
        return {}
    given = settings.get("gradient_accumulation_steps", 1)
    if given not in (None, 1):
        raise SpecError(f"{FIELD} gradient_accumulation_kwargs num_steps={steps} with gradient_accumulation_steps="
                        f"{given}: the Trainer refuses both (set one of them)")
    return {"gradient_accumulation_steps": steps}

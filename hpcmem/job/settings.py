"""The job settings namespace (TRL field names, accelerate's names, hpcmem's few own) and the type of each, checked
where a layer of settings enters: flags, the TRL YAML, an accelerate config, a preset's `defaults`.

Kinds come from the spec dataclasses' defaults (one name per setting, hpcmem.job.spec), so a new spec field is checked
without an entry here. Ranges (≥ 1, choices) stay with the specs, which check them on construction; this layer checks
what the specs cannot: the Python type, integrality, finiteness, an upper bound, text without control characters —
and turns TRL's textual forms ("8", "yes", '{"selective": true}') into values.
"""

from __future__ import annotations

from dataclasses import MISSING, fields
from functools import lru_cache
from typing import Any, Callable, Mapping

from hpcmem.inputs import values as v
from hpcmem.job.accelerator_config import names_a_file
from hpcmem.job.spec import ParallelSpec, TrainSpec

Checker = Callable[[str, Any], Any]


def _nullable(check: Checker) -> Checker:
    return lambda name, value: None if value is None else check(name, value)


def _kind(default: Any, nullable: bool) -> Checker:
    if nullable and isinstance(default, int) and not isinstance(default, bool):
        return v.optional_integer             # max_length: 1024 by default, None for no truncation
    if isinstance(default, bool):
        return v.boolean
    if isinstance(default, int):
        return lambda n, x: v.integer(n, x, lo=None)
    if isinstance(default, float):
        return v.number
    if isinstance(default, dict):
        return _nullable(v.json_object)
    if isinstance(default, tuple):
        return _nullable(v.text_list)
    if default is None:                       # max_length, pad_to_multiple_of, …: an integer or None
        return v.optional_integer
    return lambda n, x: v.text(n, x, max_len=256)


# Settings outside the spec dataclasses, and spec fields TRL also accepts as null (its default is None there).
_EXTRA: dict[str, Checker] = {
    "model_name_or_path": lambda n, x: v.text(n, x),
    "teacher_model_name_or_path": _nullable(lambda n, x: v.text(n, x)),
    "teacher_model_init_kwargs": _nullable(v.json_object),
    "gpu": lambda n, x: v.text(n, x, max_len=256),    # a catalog name or a description (hpcmem.gpus.describe)
    "accelerate_config": lambda n, x: v.text(n, x),
    "expandable_segments": v.boolean,
    "tokens_per_micro_batch": v.optional_integer,
    "label_tokens_per_micro_batch": v.optional_integer,
    "model_init_kwargs": _nullable(v.json_object),
    # a mapping, its JSON text, or the path of a JSON file, as TrainingArguments takes it
    # (hpcmem.job.accelerator_config)
    "accelerator_config": _nullable(lambda n, x: v.text(n, x, max_len=4096) if names_a_file(x) else
                                    v.json_object(n, x)),
    "torch_dtype": _nullable(lambda n, x: v.text(n, x, max_len=64)),
    "dtype": _nullable(lambda n, x: v.text(n, x, max_len=64)),
    "attn_implementation": _nullable(lambda n, x: v.text(n, x, max_len=64)),
    "bf16": _nullable(v.boolean),
    "max_grad_norm": _nullable(v.number),
    "router_aux_loss_coef": _nullable(v.number),
}


@lru_cache(maxsize=1)
def checkers() -> dict[str, Checker]:
    """Setting name → checker, for every name hpcmem reads from a settings layer."""
    out: dict[str, Checker] = {}
    for cls in (TrainSpec, ParallelSpec):
        for f in fields(cls):
            if f.name != "trainer":
                default = f.default_factory() if f.default_factory is not MISSING else f.default
                out[f.name] = _kind(default, nullable="None" in str(f.type))
    out.update(_EXTRA)
    return out


def check_settings(settings: Any, source: str) -> dict[str, Any]:
    """One layer of settings, checked and converted; names hpcmem does not read pass unchanged (they are reported
    as ignored and written back to the TRL YAML). Raises InputError naming `source`, the field and the rule."""
    if not isinstance(settings, Mapping):
        raise v.InputError(f"{source} must hold a mapping of field names to values; got {v.shown(settings)}")
    table = checkers()
    out: dict[str, Any] = {}
    for key, value in settings.items():
        if not isinstance(key, str):
            raise v.InputError(f"{source}: key {v.shown(key)} is not a field name (field names are text)")
        check = table.get(key)
        try:
            out[key] = check(key, value) if check else value
        except v.InputError as exc:
            raise v.InputError(f"{source}: {exc.problems[0]}") from None
    return out

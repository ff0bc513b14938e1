"""What peft makes of a LoRA job's target_modules on an MoE type with fused experts (stdlib).

With transformers 5 the experts of Mixtral, Qwen3-MoE, OLMoE, DeepSeek-V3 … are fused 3-D parameters
(`mlp.experts.gate_up_proj` [E, 2·I, H], `mlp.experts.down_proj` [E, H, I]) and the router is a module holding a bare
`weight`. peft 0.21.2 rewrites the LoraConfig of those types before it injects anything
(peft/utils/transformers_weight_conversion.py `_convert_peft_config_moe`, called from tuners_utils.py
`BaseTuner.inject_adapter`), so that an adapter trained on transformers 4 still loads:

- a target_modules string: "all-linear" becomes every nn.Linear leaf name plus the transformers-4 names of the experts
  and the router (`_resolve_string_target_modules`: `gate`, `gate_proj`, `up_proj`, `down_proj`; Mixtral's `w1`, `w3`,
  `w2`);
- every target equal to, or ending in `.` + , such a name leaves target_modules and adds its transformers-5 parameter
  to target_parameters (`gate` → `gate.weight`, `gate_proj`/`up_proj` → `gate_up_proj`, `down_proj` → `down_proj`).
  The name goes as a whole: a shared expert's or a dense layer's `gate_proj`/`up_proj`/`down_proj` nn.Linear loses
  its adapter too, and peft matches target_parameters against `<module>.<parameter>` (tuners_utils.py
  `_inject_parameters`), which `...shared_expert.down_proj.weight` does not end in;
- the fused parameter takes rank and alpha × the names it fuses (rank_pattern / alpha_pattern `.*\\.gate_up_proj`);
  naming some of them but not all raises "Cannot convert PEFT target(s) …".

The adapted parameters become `lora.ParamWrapper`s, which refuse lora_dropout ≠ 0 and use_dora
(peft/tuners/lora/layer.py `ParamWrapper.__init__`). Which types are rewritten is data: peft_moe.json, regenerated
from the installed libraries by hpcmem.trace.peft_moe_table.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import TYPE_CHECKING, Any

from hpcmem.datapath import PACKAGE_DIR
from hpcmem.models.params import LinearModule, all_linear_targets, linear_modules, parameters_named, peft_model_type

if TYPE_CHECKING:
    from hpcmem.models.spec import ModelSpec

TABLE_PATH = PACKAGE_DIR / "models" / "peft_moe.json"
ALL_LINEAR = "all-linear"       # peft/utils/constants.py INCLUDE_LINEAR_LAYERS_SHORTHAND


@cache
def table() -> dict[str, Any]:
    return json.loads(TABLE_PATH.read_text(encoding="utf-8"))


def conversion_base(model_type: str) -> str | None:
    """The base whose name mapping peft applies to this type's LoRA targets, or None when peft rewrites nothing."""
    return table()["types"].get(model_type)


@dataclass(frozen=True)
class PeftTargets:
    """peft's LoRA targets after its transformers-5 conversion."""

    modules: tuple[str, ...]                      # target_modules left (the user's names; all-linear: leaf names)
    parameters: tuple[str, ...] = ()              # target_parameters (the user's and those the conversion added)
    rank_factors: tuple[tuple[str, int], ...] = ()  # fused parameter → factor on r and lora_alpha
    renamed: tuple[tuple[str, str], ...] = ()     # (target name given to peft, the parameter it became)
    error: str = ""                               # peft's ValueError, when the conversion raises


def resolve(model_type: str, target_modules: tuple[str, ...], target_parameters: tuple[str, ...],
            linear_leaves: tuple[str, ...]) -> PeftTargets:
    """peft's targets for a job: `target_modules` as TRL hands them on (("all-linear",) is peft's shorthand),
    `linear_leaves` the last name parts of the model's nn.Linear layers (all-linear's own resolution,
    tuners_utils.py `_maybe_include_all_linear_layers`)."""
    all_linear = ALL_LINEAR in target_modules
    base = conversion_base(model_type)
    if base is None:
        return PeftTargets(modules=tuple(dict.fromkeys(linear_leaves)) if all_linear else tuple(target_modules),
                           parameters=tuple(target_parameters))
    mapping: dict[str, str] = table()["bases"][base]["modules"]
    fused: dict[str, list[str]] = table()["bases"][base]["fused"]
    names = (tuple(dict.fromkeys(linear_leaves)) + tuple(n for n in mapping if n not in linear_leaves)
             if all_linear else tuple(target_modules))
    parameters = dict.fromkeys(target_parameters)
    remaining, renamed, matched = [], [], set()
    for name in names:
        old = next((o for o in mapping if name == o or name.endswith(f".{o}")), None)   # the mapping's order decides
        if old is None:
            remaining.append(name)
            continue
        renamed.append((name, mapping[old]))
        parameters[mapping[old]] = None
        matched.add(old)
    factors, error = [], ""
    for new, olds in fused.items():
        have = matched & set(olds)
        if 0 < len(have) < len(olds):
            error = (f"Cannot convert PEFT target(s) {', '.join(sorted(have))} without also targeting "
                     f"{', '.join(sorted(set(olds) - have))} because they are fused into {new}.")
        elif len(have) == len(olds) > 1:
            factors.append((new, len(olds)))
    return PeftTargets(modules=tuple(remaining), parameters=tuple(parameters), rank_factors=tuple(factors),
                       renamed=tuple(renamed), error=error)


@lru_cache(maxsize=256)    # pure in its arguments, like linear_modules: the planner's estimates ask per combination
def model_targets(spec: ModelSpec, target_modules: tuple[str, ...], target_parameters: tuple[str, ...]) -> PeftTargets:
    """`resolve` for a model: its type as peft reads it and its nn.Linear leaves."""
    return resolve(peft_model_type(spec), target_modules, target_parameters, all_linear_targets(spec))


@lru_cache(maxsize=256)    # pure in its arguments (a frozen PeftTargets)
def adapted(spec: ModelSpec, targets: PeftTargets) -> tuple[tuple[LinearModule, ...], tuple[LinearModule, ...]]:
    """(the nn.Linear layers peft wraps as lora.Linear — leaf name in target_modules —, the weights it wraps as
    lora.ParamWrapper — target_parameters)."""
    names = set(targets.modules)
    modules = tuple(m for m in linear_modules(spec) if m.nn_linear and m.leaf in names)
    return modules, parameters_named(spec, targets.parameters)

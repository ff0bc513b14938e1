"""peft's refusals of LoRA on bare parameters, whether the user names them (lora_target_parameters) or peft's
transformers-5 MoE conversion makes them out of lora_target_modules (hpcmem.models.peft_targets): what
get_peft_model raises, said before the job runs.

- peft/tuners/lora/layer.py `ParamWrapper.__init__`: "lora.ParamWrapper does not work with lora_dropout != 0." and
  "... with use_dora=True." (the other settings it refuses — fan_in_fan_out, lora_bias, VeLoRA, KaSA — TRL's
  ModelConfig does not pass);
- peft/utils/transformers_weight_conversion.py `_convert_peft_config_moe`: "Cannot convert PEFT target(s) …" when a
  fused projection is named without its partner;
- peft/tuners/tuners_utils.py `BaseTuner.inject_adapter`: nothing to adapt — no target_modules left and no
  target_parameters that match a parameter ("No `target_modules` passed but also no `target_parameters` found.").

A ParamWrapper exists only for a parameter the model has (`_inject_parameters` matches `<module>.<parameter>` keys):
a target parameter the model lacks (DeepSeek-V3's first_k_dense_replace dense layers have no experts, so a model of
only those layers has no `mlp.experts.gate_up_proj`) wraps nothing, refuses nothing, and peft raises only when no
module is left to adapt either.

TRL's disable_dropout (DPO, Reward, KTO) does not help: it zeroes nn.Dropout modules after get_peft_model, which has
already raised on the config's lora_dropout.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpcmem.models.params import parameters_named
from hpcmem.models.peft_targets import model_targets, table

if TYPE_CHECKING:
    from hpcmem.job.protocol import Job
    from hpcmem.job.spec import TrainSpec

# peft/tuners/lora/layer.py ParamWrapper.__init__, word for word
DROPOUT = "lora.ParamWrapper does not work with lora_dropout != 0."
DORA = "lora.ParamWrapper does not work with use_dora=True."
# peft/tuners/tuners_utils.py BaseTuner.inject_adapter, word for word
NOTHING = ("No `target_modules` passed but also no `target_parameters` found. Please check the values for these "
           "arguments.")


def param_wrapper_problems(job: Job) -> list[str]:
    """One line per reason peft's get_peft_model would raise on the job's bare-parameter adapters."""
    t, m = job.train, job.model
    if not t.use_peft or not (t.lora_target_modules or t.lora_target_parameters):
        return []     # peft's default targets: hpcmem.models.params.peft_default_targets says what peft does
    targets = model_targets(m, tuple(t.lora_target_modules), tuple(t.lora_target_parameters))
    peft = f"peft {table()['versions']['peft']}"
    if targets.error:
        return [f"lora_target_modules {','.join(t.lora_target_modules)}: on model_type {m.model_type} {peft} maps "
                f"the experts' transformers-4 names onto fused parameters and raises: {targets.error}"]
    if not targets.parameters:
        return []
    if targets.renamed:
        converted = sorted({new for _, new in targets.renamed})
        why = (f"on model_type {m.model_type} {peft} turns lora_target_modules {','.join(t.lora_target_modules)} "
               f"into target_parameters {', '.join(converted)} (its transformers-5 MoE conversion: the fused experts "
               "and the router), and")
    else:
        why = f"lora_target_parameters {', '.join(t.lora_target_parameters)}:"
    wrapped = parameters_named(m, targets.parameters)
    if not wrapped:
        if targets.modules:
            return []         # the parameters match nothing; peft adapts the modules left and wraps no parameter
        return [f"{_named(t)}: on model_type {m.model_type} {peft} leaves no target_modules and target_parameters "
                f"{', '.join(targets.parameters)} name no parameter of {m.name}: get_peft_model raises '{NOTHING}'"]
    out = []
    if t.lora_dropout:
        out.append(f"lora_dropout {t.lora_dropout}: {why} get_peft_model raises '{DROPOUT}' (TRL's default is "
                   "0.05); set lora_dropout 0, or name only modules that stay nn.Linear")
    if t.use_dora:
        out.append(f"use_dora: {why} get_peft_model raises '{DORA}'")
    return out


def _named(t: TrainSpec) -> str:
    parts = [f"lora_target_modules {','.join(t.lora_target_modules)}"] if t.lora_target_modules else []
    parts += [f"lora_target_parameters {','.join(t.lora_target_parameters)}"] if t.lora_target_parameters else []
    return ", ".join(parts)

"""peft's "all-linear" on an MoE type whose targets it converts, where a vision (or audio) linear's last name part is a
number: get_peft_model raises.

peft 0.21.2 peft/utils/transformers_weight_conversion.py `_convert_peft_config_moe` (for the types of
hpcmem.models.peft_moe.json) resolves the "all-linear" string up front to the last name part of every nn.Linear
(`_resolve_string_target_modules`: `{name.rsplit(".", 1)[-1] for name in resolved}`), and peft then matches each such
name against every module whose path ends in "." + it (tuners_utils.py `check_target_module_exists`). A linear inside
an nn.ModuleList of mixed layers — Qwen3-Omni's `Qwen3OmniMoeVisionPatchMerger.mlp`, Linear → GELU → Linear, so
`merger.mlp.0` and `merger.mlp.2` — turns into the targets "0" and "2", which also end the paths of the decoder's and
the encoders' layers (`model.language_model.layers.0`, `model.audio_tower.layers.0`, …); LoRA cannot wrap a layer:
peft/tuners/lora/model.py `_create_new_module` raises "Target module … is not supported".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpcmem.models.peft_targets import ALL_LINEAR, conversion_base, table

if TYPE_CHECKING:
    from hpcmem.job.protocol import Job


def numbered_leaf_problems(job: Job) -> list[str]:
    """One line when all-linear on a converted type reaches a linear whose last name part is a number that is also a
    decoder layer's index."""
    t, m = job.train, job.model
    if not t.use_peft or ALL_LINEAR not in t.lora_target_modules or m.vision is None:
        return []
    if conversion_base(m.model_type) is None or not hasattr(m.vision, "linears"):
        return []
    names = sorted({x.name for x in m.vision.linears() if x.name.rsplit(".", 1)[-1].isdecimal()
                    and int(x.name.rsplit(".", 1)[-1]) < m.num_hidden_layers})
    if not names:
        return []
    leaves = sorted({n.rsplit(".", 1)[-1] for n in names})
    peft = f"peft {table()['versions']['peft']}"
    return [f"lora_target_modules all-linear: on model_type {m.model_type} {peft}'s MoE conversion turns all-linear "
            f"into the last name part of every nn.Linear, among them {', '.join(repr(x) for x in leaves)} (of "
            f"{', '.join(names)}), which also end the paths of layers (e.g. model.language_model.layers.{leaves[0]}) "
            "that LoRA cannot wrap: get_peft_model raises 'Target module … is not supported'; name the linears "
            "instead (e.g. q_proj,k_proj,v_proj,o_proj,qkv,attn.proj,linear_fc1,linear_fc2)"]

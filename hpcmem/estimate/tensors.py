"""The model's persistent tensors one by one, in the order a training process allocates them (stdlib).

The caching allocator's waste on long-lived tensors depends on each tensor's size, not on their sum: a 1–10 MiB
weight takes part of a 20 MiB segment, a larger one a segment rounded up to 2 MiB (c10/cuda/CUDACachingAllocator.cpp
`get_allocation_size`). Order follows transformers' module construction (modeling_llama.py and kin: embed_tokens,
then per decoder layer self_attn q/k/v/(q/k norms)/o, mlp, the layer norms; final norm; lm_head when untied), peft's
adapters after the base model (lora_A [r, in], lora_B [out, r] per adapted linear), and torch AdamW's `_init_group`
per trainable parameter on the first step (exp_avg, exp_avg_sq in the parameter's dtype; fused/foreach keep `step`
as a 4-byte device tensor).
"""

from __future__ import annotations

from functools import lru_cache

from hpcmem.estimate.lora import LoraLayout
from hpcmem.job.trainers import entry
from hpcmem.models.params import linear_modules
from hpcmem.models.spec import ModelSpec

ADAM_OPTIMIZERS = ("adamw_torch_fused", "adamw_torch", "adamw_torch_foreach")


def _layer_weights(m: ModelSpec, layer: int, mods: list) -> list[tuple[int, int]]:
    """(in·out elements, bias elements) per linear of one decoder layer, in module order; MoE experts are 3-D.
    `mods`: linear_modules(m), computed once by the caller (a learned model's are grouped anew on each call)."""
    out = []
    for mod in mods:
        first = m.num_hidden_layers - mod.num_layers   # dense MLPs sit in the first layers of a MoE
        holds = (layer >= first) if mod.kind in ("expert", "router", "shared_expert") else (layer < mod.weight_layers)
        if holds:
            out.append((mod.in_features * mod.out_features * mod.count_per_layer, mod.out_features if mod.bias else 0))
    return out


@lru_cache(maxsize=256)        # pure in (model, trainer, bytes); the planner asks for the same model thousands of times
def parameter_sizes(m: ModelSpec, trainer: str, weight_bytes: int) -> tuple[int, ...]:
    """Bytes of every base-model parameter tensor, in allocation order (reward models: a 1-output score head)."""
    h = m.hidden_size
    sizes = [m.vocab_size * h * weight_bytes]
    qk = []
    if m.qk_norm:
        qk = ([m.head_dim, m.head_dim] if m.qk_norm_scope == "head"
              else [m.num_attention_heads * m.head_dim, m.num_key_value_heads * m.head_dim])
    mods = linear_modules(m)
    for layer in range(m.num_hidden_layers):
        for weight, bias in _layer_weights(m, layer, mods):
            sizes.append(weight * weight_bytes)
            if bias:
                sizes.append(bias * weight_bytes)
        sizes += [n * weight_bytes for n in qk]
        sizes += [h * weight_bytes] * m.norms_per_layer
    sizes.append(h * weight_bytes)
    if entry(trainer).head == "score":           # a reward model's [1, H] score head, no LM head
        sizes.append(h * weight_bytes)
    elif not m.tie_word_embeddings:
        sizes.append(m.vocab_size * h * weight_bytes)
    return tuple(sizes)


def adapter_sizes(lora: LoraLayout) -> list[int]:
    """lora_A and lora_B of every adapted linear, layer by layer (peft inject order), then those of the adapted
    parameters (peft/tuners/tuners_utils.py `inject_adapter` runs `_inject_parameters` after the modules): one
    [r·E, in] and one [out, r·E] per fused stack (ParamWrapper.update_layer)."""
    if not lora.enabled:
        return []
    out = []
    for layer in range(lora.num_layers):
        for mod in lora.adapted:
            if layer < mod.num_layers:
                r = lora.rank(mod)
                out += [r * mod.in_features * lora.adapter_bytes, mod.out_features * r * lora.adapter_bytes]
    for layer in range(lora.num_layers):
        for mod in lora.targeted:
            if layer < mod.num_layers:
                r = lora.rank(mod) * mod.count_per_layer
                out += [r * mod.in_features * lora.adapter_bytes, mod.out_features * r * lora.adapter_bytes]
    return out


def optimizer_state_sizes(optim: str, trainable: list[int]) -> list[int]:
    """AdamW's per-parameter states in `_init_group` order: step (4 B), exp_avg, exp_avg_sq."""
    if optim not in ADAM_OPTIMIZERS:
        return []
    return [s for size in trainable for s in (4, size, size)]

"""`ModelSpec` → the transformers `config.json` dict the trace builds its model from.

The ModelSpec fields carry config.json names (hpcmem/job/spec.py), so this is mostly a rename per `model_type`; the keys
each config class reads are those of transformers 5.24 (transformers/models/<type>/configuration_<type>.py). Keys
the spec does not carry keep the config class default, except the ones that change what the trace allocates:

- `sliding_window` is None for Mistral/Qwen (a window shorter than the sequence makes transformers build a banded
  mask instead of SDPA's `is_causal`; checkpoints that need it should come from their own config.json). Gemma-2 keeps
  its alternating 4096-token window, which is part of the architecture.
- MoE: `num_dense_layers` leading dense layers become Qwen3-MoE's `mlp_only_layers`.
- `head_dim` is always written; Qwen2 and Phi-3 compute it (hidden_size / heads) and would ignore another value.
"""

from __future__ import annotations

from typing import Any

from hpcmem.errors import SpecError
from hpcmem.models.spec import ModelSpec

SUPPORTED_MODEL_TYPES: tuple[str, ...] = (
    "llama", "mistral", "qwen2", "qwen3", "gemma2", "phi3", "mixtral", "qwen3_moe", "glm4")


def attn_implementation_arg(train: Any) -> str | None:
    """The `attn_implementation` TRL hands to `from_pretrained`: ModelConfig.attn_implementation, None unless the user
    set one (trl/trainer/model_config.py), so transformers picks sdpa where the model supports it and eager where not
    (Gemma-2: `_supports_sdpa` is False; modeling_utils.py `get_correct_attn_implementation`). The spec's "sdpa" is
    transformers' default standing for "unset". Trace and probe both build the model with it."""
    return None if train.attn_implementation == "sdpa" else train.attn_implementation


def hf_config_dict(spec: ModelSpec) -> dict[str, Any]:
    """The config.json dict transformers 5.24 turns back into `spec`'s architecture (for `AutoConfig.for_model`)."""
    kind = spec.model_type
    if kind not in SUPPORTED_MODEL_TYPES:
        raise SpecError(f"model {spec.name}: the trace builds {', '.join(SUPPORTED_MODEL_TYPES)}; "
                        f"model_type {kind!r} is not one of them (the analytic estimate may still cover it)")
    cfg: dict[str, Any] = {
        "model_type": kind,
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_hidden_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "head_dim": spec.head_dim,
        "tie_word_embeddings": spec.tie_word_embeddings,
        "max_position_embeddings": spec.max_position_embeddings,
    }
    act_key = "hidden_activation" if kind == "gemma2" else "hidden_act"
    cfg[act_key] = spec.hidden_act
    if kind in ("llama", "qwen3", "gemma2", "qwen3_moe", "glm4"):
        cfg["attention_bias"] = spec.qkv_bias
    if kind == "llama":
        cfg["mlp_bias"] = spec.mlp_bias
    if kind in ("mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "phi3"):
        cfg["sliding_window"] = None
    if kind == "gemma2":
        soft_final = getattr(spec, "final_logit_softcapping", None)
        soft_attn = getattr(spec, "attn_logit_softcapping", None)
        if soft_final is not None:
            cfg["final_logit_softcapping"] = soft_final or None
        if soft_attn is not None:
            cfg["attn_logit_softcapping"] = soft_attn or None
    if kind == "mixtral":
        cfg["num_local_experts"] = spec.num_experts
        cfg["num_experts_per_tok"] = spec.num_experts_per_tok
        cfg["intermediate_size"] = spec.moe_intermediate_size or spec.intermediate_size
    if kind == "qwen3_moe":
        cfg["num_experts"] = spec.num_experts
        cfg["num_experts_per_tok"] = spec.num_experts_per_tok
        cfg["moe_intermediate_size"] = spec.moe_intermediate_size
        cfg["decoder_sparse_step"] = 1
        cfg["mlp_only_layers"] = list(range(spec.num_dense_layers))
    return cfg

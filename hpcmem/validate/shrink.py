"""Shrink a model's config.json to a width a CPU trains in seconds, keeping every structural choice.

    small = shrink_config(config, max_length=32)

The depth is kept (the caller cuts it); every width is cut: hidden 64, 4 attention heads with the same query/key-value
grouping, head_dim at the same ratio to hidden/heads, FFN 128, at most 4 experts with at most 2 routed per token, MLA
ranks, SSM / linear-attention widths, a 512-token vocabulary. Kept as they are: the model type, layer types and
patterns, tied embeddings, attention variants, shared experts, dense-prefix counts, norms and activations.
Lengths keep their relation to the job's `max_length`: a sliding window shorter than the full job's length stays
shorter than the shrunk length, and max_position_embeddings below the full length stays below the shrunk one.

The widths follow the names transformers' config classes give them (configuration_<type>.py of each model, e.g.
configuration_qwen3_moe.Qwen3MoeConfig, configuration_deepseek_v3.DeepseekV3Config, configuration_jamba.JambaConfig,
configuration_qwen3_next.Qwen3NextConfig); a width this table does not name stays full size.
"""

from __future__ import annotations

import copy
import math
from typing import Any

HIDDEN = 64
HEADS = 4
HEAD_DIM = 16
FFN = 128
EXPERT_FFN = 32
EXPERTS = 4
ROUTED = 2
VOCAB = 512

HIDDEN_KEYS = ("hidden_size", "d_model", "n_embd", "dim", "embedding_dim", "lru_width", "word_embed_proj_dim")
HEAD_KEYS = ("num_attention_heads", "n_head", "num_heads", "n_heads", "attention_heads", "swa_num_attention_heads")
KV_KEYS = ("num_key_value_heads", "num_kv_heads", "swa_num_key_value_heads", "multi_query_group_num", "kv_n_heads")
HEAD_DIM_KEYS = ("head_dim", "swa_head_dim", "dim_head", "kv_channels")
FFN_KEYS = ("intermediate_size", "ffn_dim", "ffn_hidden_size", "n_inner", "dim_ff", "dff", "dense_intermediate_size",
            "shared_intermediate_size")
EXPERT_FFN_KEYS = ("moe_intermediate_size", "shared_expert_intermediate_size", "expert_ffn_hidden_size",
                   "shared_experts_intermediate_size", "moe_shared_expert_intermediate_size")
EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
ROUTED_KEYS = ("num_experts_per_tok", "num_experts_per_token", "moe_topk", "moe_top_k", "moe_k", "experts_per_token",
               "top_k")
# fixed small values: MLA ranks (DeepSeek V2/V3), SSM state and heads (Mamba 1/2, Jamba, Bamba, Zamba, Falcon-H1),
# linear attention (Qwen3-Next, Kimi), DSA indexer (DeepSeek V3.2), per-layer inputs (Gemma 3n)
FIXED = {
    "kv_lora_rank": 32, "q_lora_rank": 48, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16, "v_head_dim": 16,
    "qk_head_dim": 24, "o_lora_rank": 32, "index_head_dim": 16, "index_n_heads": 2,
    "state_size": 8, "ssm_state_size": 8, "mamba_d_state": 8, "time_step_rank": 8, "mamba_dt_rank": 8,
    "linear_key_head_dim": 16, "linear_value_head_dim": 16, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
    "linear_head_dim": 16, "linear_num_heads": 4, "hidden_size_per_layer_input": 16,
    "vocab_size_per_layer_input": VOCAB,
    "laurel_rank": 8, "router_hidden_size": 32, "gated_norm_rank": 8, "loop_gate_rank": 8, "adapter_rank": 8,
}
TOKEN_ID_KEYS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "sep_token_id",
                 "cls_token_id", "eod_token_id")
LENGTH_KEYS = ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", "context_length")
WINDOW_KEYS = ("sliding_window", "sliding_window_size", "attention_window_size", "window_size")


def shrink_config(config: dict[str, Any], *, full_length: int | None = None, max_length: int = 32) -> dict[str, Any]:
    """A copy of `config` with small widths; `full_length` is the full job's max_length, `max_length` the shrunk
    one (they scale the windows and position limits, see the module docstring)."""
    out = copy.deepcopy(config)
    _shrink(out, full_length, max_length)
    heads = _first(config, HEAD_KEYS)
    for key, value in out.items():    # multimodal wrappers (text_config, vision_config …), DBRX's attn_config
        if isinstance(value, dict) and key != "per_layer_config":
            _shrink(value, full_length, max_length, heads_of=None if _first(value, HIDDEN_KEYS) else heads)
    return out


def _shrink(c: dict[str, Any], full_length: int | None, max_length: int, heads_of: int | None = None) -> None:
    config_before = dict(c)
    hidden = _first(c, HIDDEN_KEYS)
    heads = _first(c, HEAD_KEYS) or heads_of
    _heads(c, hidden, heads)
    _set(c, HIDDEN_KEYS, HIDDEN)
    _set(c, FFN_KEYS, FFN)
    _set(c, EXPERT_FFN_KEYS, EXPERT_FFN)
    _experts(c)
    for key, value in FIXED.items():
        if _is_int(c.get(key)):
            c[key] = min(c[key], value)
    _mla(c, config_before)
    _ssm(c)
    _vocab(c)
    _lengths(c, full_length, max_length)
    layers = c.get("per_layer_config")         # per-layer overrides of the same widths (dots3, Gemma 4)
    if isinstance(layers, dict):
        for sub in layers.values():
            if isinstance(sub, dict):
                _shrink(sub, full_length, max_length, heads_of=heads)


def _heads(c: dict[str, Any], hidden: int | None, heads: int | None) -> None:
    """4 query heads; the key-value heads keep the grouping (MHA stays MHA, MQA stays MQA, GQA stays grouped);
    head_dim keeps its ratio to hidden/heads (Gemma's 256 over 3072/16 stays wider than hidden/heads)."""
    if not heads:
        return
    for key in KV_KEYS:
        kv = c.get(key)
        if _is_int(kv) and kv > 0:
            c[key] = HEADS if kv >= heads else 1 if kv == 1 else HEADS // 2
    # GPT-J's rotary_dim: the rotated part of each head keeps its share (modeling_gptj.GPTJAttention)
    if _is_int(c.get("rotary_dim")) and hidden:
        c["rotary_dim"] = max(2, int(c["rotary_dim"] * HEAD_DIM * heads / hidden) // 2 * 2)
    for key in HEAD_DIM_KEYS:
        hd = c.get(key)
        if _is_int(hd) and hd > 0 and hidden:
            ratio = hd * heads / hidden
            c[key] = max(8, int(round(HEAD_DIM * ratio / 8)) * 8)
    _set(c, HEAD_KEYS, HEADS)
    # Zamba's attention runs on [hidden, hidden] concatenated: attention_hidden_size = 2 · hidden, split over the
    # heads (configuration_zamba.ZambaConfig: attention_head_dim = attention_hidden_size / num_attention_heads)
    wide = c.get("attention_hidden_size")
    if _is_int(wide) and hidden:
        c["attention_hidden_size"] = HIDDEN * max(1, round(wide / hidden))
        if _is_int(c.get("attention_head_dim")):
            c["attention_head_dim"] = c["attention_hidden_size"] // HEADS


def _experts(c: dict[str, Any]) -> None:
    n = None
    for key in EXPERT_KEYS:
        if _is_int(c.get(key)) and c[key] > 1:
            c[key] = n = min(c[key], EXPERTS)
    for key in ROUTED_KEYS:
        if _is_int(c.get(key)) and c[key] > 0:
            c[key] = min(c[key], ROUTED, n or ROUTED)
    # DeepSeek's grouped routing (modeling_deepseek_v3.DeepseekV3TopkRouter.get_topk_indices): groups divide the
    # experts and k ≤ topk_group · experts per group
    if _is_int(c.get("n_group")) and c["n_group"] > 1:
        c["n_group"] = min(c["n_group"], 2)
        if _is_int(c.get("topk_group")):
            c["topk_group"] = min(c["topk_group"], c["n_group"])
    if _is_int(c.get("num_expert_group")) and c["num_expert_group"] > 1:
        c["num_expert_group"] = min(c["num_expert_group"], 2)


def _mla(c: dict[str, Any], before: dict[str, Any]) -> None:
    """A head_dim (or qk_head_dim) that was nope + rope stays their sum (DeepSeek V3's qk_head_dim, dots3's SWA
    head_dim: configuration_dots3_note.validate_architecture)."""
    rope = before.get("qk_rope_head_dim")
    if not _is_int(rope):
        return
    if before.get("head_dim") == rope:      # DeepseekV3Config.head_dim is the rotary part (qk_rope_head_dim)
        c["head_dim"] = c["qk_rope_head_dim"]
    # the sum may be a per-layer one: dots3's sliding layers override qk_nope_head_dim in per_layer_config
    layers = [v for v in (before.get("per_layer_config") or {}).values() if isinstance(v, dict)]
    nopes = [before.get("qk_nope_head_dim")] + [v.get("qk_nope_head_dim") for v in layers]
    for key in ("head_dim", "qk_head_dim", "swa_head_dim"):
        if any(_is_int(n) and before.get(key) == n + rope for n in nopes):
            c[key] = min(FIXED["qk_nope_head_dim"], *(n for n in nopes if _is_int(n))) + c["qk_rope_head_dim"]


def _ssm(c: dict[str, Any]) -> None:
    """Mamba-2 style heads: expand · hidden = heads · head_dim (configuration_mamba2.Mamba2Config, Bamba, Falcon-H1,
    NemotronH); the groups divide the heads."""
    for heads_key, dim_key in (("mamba_n_heads", "mamba_d_head"), ("mamba_num_heads", "mamba_head_dim"),
                               ("n_mamba_heads", "mamba_headdim"), ("num_heads", "head_dim")):
        if c.get("model_type") not in ("mamba2",) and heads_key == "num_heads":
            continue
        if _is_int(c.get(heads_key)):
            expand = c.get("mamba_expand") or c.get("expand") or 2
            dim = 16
            if _is_int(c.get(dim_key)) or c.get(dim_key) == "auto" or dim_key == "mamba_headdim":
                c[dim_key] = dim
            c[heads_key] = max(1, int(expand * HIDDEN) // dim)
    for key in ("mamba_n_groups", "n_groups"):
        if _is_int(c.get(key)) and c[key] > 1:
            c[key] = 1 if c[key] == 1 else 2
    if _is_int(c.get("mamba_d_ssm")):
        c["mamba_d_ssm"] = int((c.get("mamba_expand") or 2) * HIDDEN)


def _vocab(c: dict[str, Any]) -> None:
    for key in ("vocab_size", "unpadded_vocab_size"):
        if _is_int(c.get(key)):
            c[key] = VOCAB
    for key in TOKEN_ID_KEYS:
        v = c.get(key)
        if _is_int(v) and v >= VOCAB:
            c[key] = {"pad_token_id": 0, "bos_token_id": 1}.get(key, 2)
        elif isinstance(v, list):
            c[key] = [x if not _is_int(x) or x < VOCAB else 2 for x in v]


def _lengths(c: dict[str, Any], full_length: int | None, max_length: int) -> None:
    scale = max_length / full_length if full_length else 1.0
    for key in WINDOW_KEYS:
        w = c.get(key)
        if _is_int(w) and w > 0 and full_length and w < full_length:
            c[key] = max(2, min(max_length - 1, int(math.ceil(w * scale))))
    for key in LENGTH_KEYS:
        p = c.get(key)
        if _is_int(p) and full_length and p < full_length:     # the full job is past it: so is the shrunk one
            c[key] = max(1, max_length - 1)


def _first(c: dict[str, Any], keys: tuple[str, ...]) -> int | None:
    return next((c[k] for k in keys if _is_int(c.get(k)) and c[k] > 0), None)


def _set(c: dict[str, Any], keys: tuple[str, ...], value: int) -> None:
    for key in keys:
        v = c.get(key)
        if _is_int(v) and v > 0:
            c[key] = min(v, value)
        elif isinstance(v, list) and v and all(_is_int(x) for x in v):
            c[key] = [min(x, value) for x in v]


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)

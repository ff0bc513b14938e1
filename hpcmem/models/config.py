"""HF `config.json` dict → `ModelSpec`, the way transformers 5.24 reads it.

Each supported `model_type` has a row in `ARCHITECTURES`: the config class defaults for keys a config.json may omit
(transformers/models/<type>/configuration_<type>.py) and the layout its modeling file builds
(transformers/models/<type>/modeling_<type>.py: bias flags, q/k norms, sandwich norms, fused projections, MoE block).
A missing key takes the config class default, exactly as `AutoConfig.for_model(**cfg)` would; the torch tier checks
these rows against the installed transformers (tests/models/test_models_torch.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from hpcmem.errors import Problems, SpecError
from hpcmem.inputs.model_config import check_model_config
from hpcmem.models.spec import ModelSpec
from hpcmem.models.vision import VISION_LANGUAGE, text_part, vision_spec_from_config

# q/k/v/o bias rule of the modeling file:
#   attention_bias — q, k, v and o all follow config.attention_bias (Llama, Qwen3, Gemma2/3, OLMo2, Qwen3-MoE)
#   qkv_always     — q, k, v always carry a bias, o never (Qwen2Attention: `bias=True` hard-coded)
#   qkv_bias_key   — q, k, v follow config.qkv_bias, o never (Qwen2-MoE)
#   qkv_attention_bias — q, k, v follow config.attention_bias, o never (GLM-4)
#   none           — no bias anywhere (Mistral, Mixtral, Phi-3)
BiasRule = Literal["attention_bias", "qkv_always", "qkv_bias_key", "qkv_attention_bias", "none"]
MoeRule = Literal["", "mixtral", "qwen2_moe", "qwen3_moe"]


@dataclass(frozen=True, kw_only=True)
class Arch:
    """How transformers 5.24 builds one model_type, and its config-class defaults for omitted keys."""

    defaults: dict[str, Any]
    bias: BiasRule = "none"
    mlp_bias_key: bool = False                 # gate/up/down follow config.mlp_bias (LlamaMLP only)
    qk_norm: Literal["", "head", "proj"] = ""
    norms_per_layer: int = 2
    fused: bool = False                        # Phi-3: qkv_proj + gate_up_proj
    fused_gate_up: bool = False                # GLM-4: gate_up_proj only (q/k/v stay apart)
    rope_cat: bool = False                     # GLM-4: apply_rotary_pos_emb rebuilds q and k with torch.cat
    act_key: str = "hidden_act"                # Gemma reads hidden_activation
    moe: MoeRule = ""
    notes: tuple[str, ...] = ()                # quirks worth knowing (documentation only)
    aliases: dict[str, str] = field(default_factory=dict)   # config class attribute_map: config.json key → ours


_DENSE = {"hidden_act": "silu", "tie_word_embeddings": False}
# head_dim None: hidden_size // num_attention_heads. num_key_value_heads None: num_attention_heads.
ARCHITECTURES: dict[str, Arch] = {
    "llama": Arch(bias="attention_bias", mlp_bias_key=True, defaults={
        **_DENSE, "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": None, "head_dim": None, "attention_bias": False,
        "mlp_bias": False, "max_position_embeddings": 2048}),
    "mistral": Arch(defaults={
        **_DENSE, "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": None, "max_position_embeddings": 131072}),
    "qwen2": Arch(bias="qkv_always", defaults={
        **_DENSE, "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 32, "head_dim": None, "max_position_embeddings": 32768},
        notes=("Qwen2Attention hard-codes bias=True on q/k/v; config.attention_bias is not read",)),
    "qwen3": Arch(bias="attention_bias", qk_norm="head", defaults={
        **_DENSE, "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 32, "head_dim": 128, "attention_bias": False,
        "max_position_embeddings": 32768}),
    "gemma2": Arch(bias="attention_bias", norms_per_layer=4, act_key="hidden_activation", defaults={
        "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True, "vocab_size": 256000,
        "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26, "num_attention_heads": 8,
        "num_key_value_heads": 4, "head_dim": 256, "attention_bias": False, "max_position_embeddings": 8192,
        "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0},
        notes=("Gemma2PreTrainedModel._supports_sdpa is False (softcapping): attention runs eager",
               "embeddings are scaled by sqrt(hidden_size) (no parameter)")),
    "gemma3_text": Arch(bias="attention_bias", qk_norm="head", norms_per_layer=4, act_key="hidden_activation",
                        defaults={
        "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True, "vocab_size": 262208,
        "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26, "num_attention_heads": 8,
        "num_key_value_heads": 4, "head_dim": 256, "attention_bias": False, "max_position_embeddings": 131072,
        "final_logit_softcapping": None, "attn_logit_softcapping": None}),
    "phi3": Arch(fused=True, defaults={
        **_DENSE, "vocab_size": 32064, "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": None, "head_dim": None, "max_position_embeddings": 4096},
        notes=("fused qkv_proj and gate_up_proj Linears: LoRA targets are qkv_proj/gate_up_proj",)),
    "olmo2": Arch(bias="attention_bias", qk_norm="proj", defaults={
        **_DENSE, "vocab_size": 50304, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": None, "head_dim": None, "attention_bias": False,
        "max_position_embeddings": 2048},
        notes=("norms after attention and MLP only (no input_layernorm); q/k norms span all heads",)),
    # modeling_glm4.py: q/k/v follow config.attention_bias, o never (Glm4Attention.__init__); four RMSNorms per layer
    # around attention and MLP (Glm4DecoderLayer: post_self_attn_layernorm, post_mlp_layernorm feed the residual add),
    # cast to the input dtype before the weight multiply (Glm4RMSNorm.forward, as Llama's); one gate_up_proj
    # (Glm4MLP); `apply_rotary_pos_emb` rotates the first rotary_dim channels and concatenates the rest back.
    # Defaults: configuration_glm4.py Glm4Config.
    "glm4": Arch(bias="qkv_attention_bias", norms_per_layer=4, fused_gate_up=True, rope_cat=True, defaults={
        **_DENSE, "vocab_size": 151552, "hidden_size": 4096, "intermediate_size": 13696, "num_hidden_layers": 40,
        "num_attention_heads": 32, "num_key_value_heads": 2, "head_dim": 128, "attention_bias": True,
        "max_position_embeddings": 131072},
        notes=("fused gate_up_proj Linear (LoRA target gate_up_proj); q/k/v bias, o without",
               "partial rotary (partial_rotary_factor 0.5): q and k rebuilt by torch.cat",
               "not counted: each layer's interleaved cos/sin copies (2 · tokens · rotary_dim, ~0.2 % of a layer)")),
    # Types transformers' causal-LM mapping builds with LlamaForCausalLM itself: Llama's layout, their config class's
    # defaults and attribute_map (configuration_exaone.py, configuration_internlm3.py, configuration_iquestcoder.py).
    "exaone": Arch(bias="attention_bias", mlp_bias_key=True, aliases={
        "num_layers": "num_hidden_layers", "activation_function": "hidden_act"}, defaults={
        **_DENSE, "vocab_size": 102400, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": None, "attention_bias": False,
        "mlp_bias": False, "max_position_embeddings": 4096}, notes=("built by LlamaForCausalLM",)),
    "internlm3": Arch(bias="attention_bias", mlp_bias_key=True, aliases={
        "qkv_bias": "attention_bias", "bias": "mlp_bias"}, defaults={
        **_DENSE, "vocab_size": 128512, "hidden_size": 4096, "intermediate_size": 10240, "num_hidden_layers": 48,
        "num_attention_heads": 32, "num_key_value_heads": 2, "head_dim": 128, "attention_bias": False,
        "mlp_bias": False, "max_position_embeddings": 32768}, notes=("built by LlamaForCausalLM",)),
    "iquestcoder": Arch(bias="attention_bias", mlp_bias_key=True, defaults={
        **_DENSE, "vocab_size": 76800, "hidden_size": 5120, "intermediate_size": 27648, "num_hidden_layers": 80,
        "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128, "attention_bias": False,
        "mlp_bias": False, "max_position_embeddings": 131072}, notes=("built by LlamaForCausalLM",)),
    "mixtral": Arch(moe="mixtral", defaults={
        **_DENSE, "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": None, "max_position_embeddings": 131072,
        "num_local_experts": 8, "num_experts_per_tok": 2}),
    "qwen2_moe": Arch(bias="qkv_bias_key", moe="qwen2_moe", defaults={
        **_DENSE, "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 24,
        "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": None, "max_position_embeddings": 32768,
        "qkv_bias": True, "num_experts": 60, "num_experts_per_tok": 4, "moe_intermediate_size": 1408,
        "shared_expert_intermediate_size": 5632, "decoder_sparse_step": 1, "mlp_only_layers": None}),
    "qwen3_moe": Arch(bias="attention_bias", qk_norm="head", moe="qwen3_moe", defaults={
        **_DENSE, "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 24,
        "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": None, "attention_bias": False,
        "max_position_embeddings": 32768, "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768,
        "decoder_sparse_step": 1, "mlp_only_layers": None}),
}
SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(sorted(ARCHITECTURES))
_INT_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")


def unwrap_text_config(cfg: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """A multimodal config (gemma3, …) nests its decoder under `text_config`; return (decoder dict, outer type)."""
    inner = cfg.get("text_config")
    if not isinstance(inner, dict) or str(cfg.get("model_type")) in ARCHITECTURES:     # any JSON value: never hashed
        return cfg, ""
    merged = dict(inner)
    # The outer config owns tying for multimodal wrappers (Gemma3Config.tie_word_embeddings).
    if "tie_word_embeddings" not in merged and "tie_word_embeddings" in cfg:
        merged["tie_word_embeddings"] = cfg["tie_word_embeddings"]
    return merged, str(cfg.get("model_type", ""))


def has_family(cfg: dict[str, Any]) -> bool:
    """Whether a family descriptor covers the config's decoder (its own type, a multimodal config's text_config, or
    a vision-language type whose tower hpcmem.models.vision describes)."""
    if isinstance(cfg, dict) and str(cfg.get("model_type")) in VISION_LANGUAGE:
        return True
    return isinstance(cfg, dict) and str(unwrap_text_config(cfg)[0].get("model_type")) in ARCHITECTURES


def _check_rotary_dim(cfg: dict[str, Any], head_dim: int, name: str) -> None:
    """Every family here rotates its queries and keys (RoPE), and transformers refuses a config whose fully rotated
    head is odd and wider than 4 (modeling_rope_utils.py RotaryEmbeddingConfigMixin `_validate_default_rope_parameters`:
    "RoPE requires an even rotary dimension"), so the model could not even be built."""
    rope = cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), dict) else {}
    factor = rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    if not isinstance(factor, (int, float)) or isinstance(factor, bool):
        return          # not a number: transformers' own check names it when the model is built
    if head_dim > 4 and head_dim % 2 and int(head_dim * factor) == head_dim:
        raise SpecError(f"model {name}: head_dim {head_dim} must be even — RoPE rotates pairs of dimensions and "
                        f"transformers refuses an odd rotary dimension (partial_rotary_factor {factor})")


def model_spec_from_config(cfg: dict[str, Any], name: str) -> ModelSpec:
    """Read a transformers config.json dict into a `ModelSpec` (see `ARCHITECTURES` for what is read and why)."""
    check_model_config(cfg, name)         # JSON types and ranges of every key read below (hpcmem.inputs)
    dtype = checkpoint_dtype(cfg)
    vision = vision_spec_from_config(cfg, name)
    outer_type = str(cfg.get("model_type"))
    cfg, wrapper = (text_part(cfg), "") if vision is not None else unwrap_text_config(cfg)
    model_type = cfg.get("model_type")
    arch = ARCHITECTURES.get(str(model_type))
    if arch is None:
        outer = f" (inside {wrapper or outer_type})" if wrapper or vision is not None else ""
        raise SpecError(
            f"model {name}: model_type {model_type!r}{outer} is not supported; hpcmem counts decoder-only "
            f"{', '.join(SUPPORTED_MODEL_TYPES)}. Use one of them or `hpcmem models list` for the offline catalog.")

    if arch.aliases:
        cfg = {arch.aliases.get(k, k): v for k, v in cfg.items()}

    def get(key: str) -> Any:
        return cfg[key] if key in cfg else arch.defaults.get(key)

    p = Problems()
    for key in _INT_KEYS:
        value = get(key)
        p.check(isinstance(value, int) and not isinstance(value, bool) and value > 0,
                f"model {name}: {key} must be a positive integer, got {value!r}")
    p.raise_if_any()
    heads, hidden = get("num_attention_heads"), get("hidden_size")
    kv_heads = get("num_key_value_heads") or heads
    head_dim = get("head_dim") or hidden // heads
    _check_rotary_dim(cfg, head_dim, name)
    bias_on = {"attention_bias": bool(get("attention_bias")), "qkv_always": True,
               "qkv_bias_key": bool(get("qkv_bias")), "qkv_attention_bias": bool(get("attention_bias")),
               "none": False}[arch.bias]
    return ModelSpec(
        name=name, model_type=outer_type if vision is not None else str(model_type), vision=vision, vocab_size=get("vocab_size"), hidden_size=hidden,
        intermediate_size=get("intermediate_size"), num_hidden_layers=get("num_hidden_layers"),
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
        tie_word_embeddings=bool(get("tie_word_embeddings")), hidden_act=str(get(arch.act_key) or "silu"),
        qkv_bias=bias_on, o_bias=bias_on and arch.bias == "attention_bias",
        mlp_bias=bool(get("mlp_bias")) if arch.mlp_bias_key else False,
        qk_norm=bool(arch.qk_norm), qk_norm_scope=arch.qk_norm or "head", norms_per_layer=arch.norms_per_layer,
        fused_qkv=arch.fused, fused_gate_up=arch.fused or arch.fused_gate_up, rope_cat=arch.rope_cat,
        max_position_embeddings=int(get("max_position_embeddings") or 0) or 4096,
        final_logit_softcapping=float(get("final_logit_softcapping") or 0.0),
        attn_logit_softcapping=float(get("attn_logit_softcapping") or 0.0),
        wrapper_model_type=wrapper, sliding_window=sliding_window(cfg, str(model_type)), dtype=dtype,
        sliding_layers=sliding_layers(cfg, str(model_type), int(get("num_hidden_layers"))),
        **_moe_fields(arch.moe, get),
    )


def checkpoint_dtype(cfg: dict[str, Any]) -> str | None:
    """The dtype a config.json names for its checkpoint: `dtype`, else the older `torch_dtype` (transformers 5.24
    configuration_utils.py `PreTrainedConfig.__post_init__` keeps `dtype` when both are set), read from the outer
    config as from_pretrained reads `config.dtype` (modeling_utils.py `_get_dtype`); None when it names none."""
    value = cfg.get("dtype")
    value = cfg.get("torch_dtype") if value is None else value
    return None if value is None else str(value)


# transformers' config classes: Gemma2/3 alternate sliding and full layers unless layer_types says otherwise; the Qwen
# families slide only with use_sliding_window; MistralConfig's sliding_window defaults to 4096 when the key is absent.
_ALTERNATING = ("gemma2", "gemma3", "gemma3_text")
_USE_FLAG = ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe")
_WINDOW_DEFAULT = {"mistral": 4096, "gemma2": 4096, "gemma3": 4096, "gemma3_text": 4096}


def sliding_window(cfg: dict[str, Any], model_type: str) -> int:
    """The window of the model's sliding-attention layers, 0 when every layer attends to the whole sequence — what
    accelerate reads (`layer_types`, else `sliding_window`; big_modeling.py `_attach_context_parallel_hooks`)."""
    window = cfg.get("sliding_window", _WINDOW_DEFAULT.get(model_type)) or 0
    types = cfg.get("layer_types")
    if isinstance(types, list):
        return (window or 1) if any(t != "full_attention" for t in types) else 0
    if model_type in _ALTERNATING:
        return window or _WINDOW_DEFAULT[model_type]
    if model_type in _USE_FLAG:
        return window if cfg.get("use_sliding_window") else 0
    return window


# sliding_window_pattern defaults of the alternating configs (configuration_gemma2.py: every other layer;
# configuration_gemma3.py `_sliding_window_pattern`: 6)
_PATTERN_DEFAULT = {"gemma2": 2, "gemma3": 6, "gemma3_text": 6}


def sliding_layers(cfg: dict[str, Any], model_type: str, num_layers: int) -> tuple[int, ...]:
    """The decoder layers that attend within the sliding window, as transformers' config classes lay them out:
    `layer_types` where config.json names it; else Gemma2/3's pattern (configuration_gemma2.py, configuration_gemma3.py:
    layer i slides unless (i + 1) % pattern == 0); the Qwen families' layers from max_window_layers on, with
    use_sliding_window (configuration_qwen2.py); else every layer where a window is set (Mistral, Phi-3: one
    create_sliding_window_causal_mask for the model, modeling_mistral.py)."""
    if not sliding_window(cfg, model_type):
        return ()
    types = cfg.get("layer_types")
    if isinstance(types, list):
        return tuple(i for i, t in enumerate(types[:num_layers]) if t == "sliding_attention")
    if model_type in _ALTERNATING:
        pattern = int(cfg.get("sliding_window_pattern") or _PATTERN_DEFAULT[model_type])
        return tuple(i for i in range(num_layers) if (i + 1) % pattern)
    if model_type in _USE_FLAG:
        return tuple(range(int(cfg.get("max_window_layers") or 0), num_layers))
    return tuple(range(num_layers))


def _moe_fields(rule: MoeRule, get: Any) -> dict[str, Any]:
    """Expert counts and dense-layer placement of an MoE block (empty for a dense model)."""
    if rule == "mixtral":
        # MixtralDecoderLayer: every layer is sparse; each expert is an intermediate_size SwiGLU (modeling_mixtral.py).
        return {"num_experts": int(get("num_local_experts")), "num_experts_per_tok": int(get("num_experts_per_tok")),
                "moe_intermediate_size": int(get("intermediate_size"))}
    num_experts = int(get("num_experts") or 0) if rule else 0
    if num_experts == 0:
        return {}
    # Qwen2MoeDecoderLayer / Qwen3MoeDecoderLayer: layer i is sparse iff i not in mlp_only_layers and
    # (i + 1) % decoder_sparse_step == 0; any other layer holds a dense intermediate_size MLP.
    step = int(get("decoder_sparse_step") or 1)
    only = set(get("mlp_only_layers") or ())
    dense = sum(1 for i in range(int(get("num_hidden_layers"))) if i in only or (i + 1) % step != 0)
    fields = {"num_experts": num_experts, "num_experts_per_tok": int(get("num_experts_per_tok")),
              "moe_intermediate_size": int(get("moe_intermediate_size")), "num_dense_layers": dense}
    if rule == "qwen2_moe":
        # Qwen2MoeSparseMoeBlock always builds shared_expert (an MLP of shared_expert_intermediate_size) and
        # shared_expert_gate = Linear(hidden, 1); Qwen3-MoE has neither.
        fields |= {"shared_expert_intermediate_size": int(get("shared_expert_intermediate_size") or 0),
                   "shared_expert_gate": True}
    return fields

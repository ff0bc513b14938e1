"""Parameter counts and the Linear layers of a decoder, from a `ModelSpec` alone (stdlib).

Every count is the shape of a tensor that transformers 5.24 allocates (transformers/models/<type>/modeling_<type>.py):

    embed_tokens  V·H                          lm_head  V·H, 0 when tie_word_embeddings (one shared tensor)
    q_proj  H·(n_h·d) [+ n_h·d]   k_proj, v_proj  H·(n_kv·d) [+ n_kv·d]   o_proj  (n_h·d)·H [+ H]
    q_norm/k_norm  d each (Qwen3, Gemma3) or n_h·d + n_kv·d (OLMo2)
    dense MLP  3·H·I (gate, up, down; SwiGLU/GeGLU) [+ 2·I + H bias]; Phi-3 fuses gate/up into gate_up_proj [2I, H]
    experts  E·3·H·I_moe as two 3D nn.Parameters: gate_up_proj [E, 2·I_moe, H], down_proj [E, H, I_moe]
    router  E·H (a TopKRouter `weight` nn.Parameter)     shared expert  3·H·S + H (Qwen2-MoE shared_expert_gate)
    RMSNorm  H each, norms_per_layer per layer (2; Gemma2/3 sandwich: 4) + one final norm

V vocab, H hidden, d head_dim, n_h/n_kv query/key-value heads, I intermediate, E experts, S shared expert width.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, NamedTuple

from hpcmem.errors import SpecError

if TYPE_CHECKING:
    from hpcmem.models.spec import ModelSpec


@dataclass(frozen=True, kw_only=True)
class ParamBreakdown:
    """Parameters by place; `total` is the sum of the parts (checked in __post_init__)."""

    embed: int
    attention_per_layer: int          # q/k/v/o weights + biases + q/k norms
    norms_per_layer: int              # RMSNorm weights of one decoder layer
    mlp_per_layer: int                # dense MLP, in each of the `num_dense_layers`
    experts_per_layer: int            # routed experts, in each of the `num_moe_layers`
    router_per_layer: int
    shared_expert_per_layer: int      # shared expert MLP + its gate (Qwen2-MoE)
    num_layers: int
    num_dense_layers: int             # layers holding a dense MLP (all of them for a dense model)
    num_moe_layers: int
    final_norm: int
    lm_head: int                      # 0 when tied to embed
    extra: int                        # ModelSpec.extra_params, counted verbatim
    experts_active_per_layer: int     # routed expert parameters one token passes through (top-k of E)
    total: int
    inactive_experts: int = 0         # learned profiles: routed expert parameters a token skips, all layers

    def __post_init__(self) -> None:
        assert self.num_dense_layers + self.num_moe_layers == self.num_layers, self
        parts = sum(self.parts().values())
        assert parts == self.total, f"parameter parts add up to {parts:,}, total says {self.total:,}"

    def parts(self) -> dict[str, int]:
        """Whole-model parameters per component; their sum is `total`."""
        return {
            "embed": self.embed,
            "attention": self.num_layers * self.attention_per_layer,
            "norms": self.num_layers * self.norms_per_layer + self.final_norm,
            "mlp": self.num_dense_layers * self.mlp_per_layer,
            "experts": self.num_moe_layers * self.experts_per_layer,
            "router": self.num_moe_layers * self.router_per_layer,
            "shared_expert": self.num_moe_layers * self.shared_expert_per_layer,
            "lm_head": self.lm_head,
            "extra": self.extra,
        }

    @property
    def active(self) -> int:
        """Parameters one token uses: total less the routed experts it is not sent to (Fedus et al. 2021, §2)."""
        return (self.total - self.num_moe_layers * (self.experts_per_layer - self.experts_active_per_layer)
                - self.inactive_experts)

    def as_dict(self) -> dict[str, int]:
        return {**asdict(self), "active": self.active}


class LinearModule(NamedTuple):
    """A weight matrix inside every one of `num_layers` decoder layers; `name` is its path inside the layer."""

    name: str                 # e.g. "self_attn.q_proj", "mlp.experts.gate_up_proj"
    in_features: int
    out_features: int
    count_per_layer: int      # matrices of this shape per layer (E for fused experts)
    num_layers: int           # decoder layers that hold it
    kind: str                 # attention | mlp | shared_expert | expert | router
    nn_linear: bool           # an nn.Linear (LoRA target_modules / "all-linear" reach it); False: a bare nn.Parameter
    bias: bool
    tied: int = 0             # of num_layers, those whose weight is another layer's (peft adapts them all the same)
    idle: int = 0             # of num_layers, those whose forward never calls it, or calls it without a graph (its
    #                           adapters get no gradient)

    @property
    def weight_layers(self) -> int:
        """The layers that hold a weight of their own (a weight tied across layers counts once)."""
        return self.num_layers - self.tied

    @property
    def leaf(self) -> str:
        """The last name part, which peft target_modules match (peft tuners_utils.py check_target_module_exists)."""
        return self.name.rsplit(".", 1)[-1]

    @property
    def params(self) -> int:
        return (self.in_features * self.out_features + (self.out_features if self.bias else 0)) * self.count_per_layer


@lru_cache(maxsize=256)    # pure in the spec; the estimate asks for it several times per job, the planner per combination
def linear_modules(spec: ModelSpec) -> tuple[LinearModule, ...]:
    """The weight matrices of the decoder layers (not embed/lm_head), as transformers 5.24 names them.

    MoE experts are NOT nn.Linear in transformers 5.24: MixtralExperts / Qwen2MoeExperts / Qwen3MoeExperts hold two
    3D nn.Parameters, so peft's `target_modules` (and "all-linear") skip them; peft reaches them only through
    `LoraConfig(target_parameters=[...])`. The router (`mlp.gate`) is a TopKRouter holding a bare `weight` too.
    """
    if spec.learned is not None:
        return tuple(learned_linear_modules(spec.learned))
    h, d, n_h, n_kv, L = (spec.hidden_size, spec.head_dim, spec.num_attention_heads, spec.num_key_value_heads,
                          spec.num_hidden_layers)
    q_out, kv_out = n_h * d, n_kv * d
    mods: list[LinearModule] = []
    if spec.fused_qkv:  # Phi3Attention.qkv_proj: out = n_h·d + 2·n_kv·d
        mods.append(LinearModule("self_attn.qkv_proj", h, q_out + 2 * kv_out, 1, L, "attention", True, spec.qkv_bias))
    else:
        mods += [LinearModule("self_attn.q_proj", h, q_out, 1, L, "attention", True, spec.qkv_bias),
                 LinearModule("self_attn.k_proj", h, kv_out, 1, L, "attention", True, spec.qkv_bias),
                 LinearModule("self_attn.v_proj", h, kv_out, 1, L, "attention", True, spec.qkv_bias)]
    mods.append(LinearModule("self_attn.o_proj", q_out, h, 1, L, "attention", True, spec.o_bias))
    num_dense = L - _num_moe_layers(spec)
    if num_dense:
        mods += _mlp("mlp", h, spec.intermediate_size, num_dense, "mlp", spec)
    if spec.is_moe:
        n_moe, e, i_moe = L - num_dense, spec.num_experts, spec.moe_intermediate_size
        mods += [LinearModule("mlp.gate", h, e, 1, n_moe, "router", False, False),
                 LinearModule("mlp.experts.gate_up_proj", h, 2 * i_moe, e, n_moe, "expert", False, False),
                 LinearModule("mlp.experts.down_proj", i_moe, h, e, n_moe, "expert", False, False)]
        if spec.shared_expert_intermediate_size or spec.shared_expert_gate:  # Qwen2-MoE builds it even at width 0
            mods += _mlp("mlp.shared_expert", h, spec.shared_expert_intermediate_size, n_moe, "shared_expert", spec)
        if spec.shared_expert_gate:
            mods.append(LinearModule("mlp.shared_expert_gate", h, 1, 1, n_moe, "shared_expert", True, False))
    return tuple(mods)


def _mlp(prefix: str, h: int, i: int, layers: int, kind: str, spec: ModelSpec) -> list[LinearModule]:
    b = spec.mlp_bias and kind == "mlp"
    down = LinearModule(f"{prefix}.down_proj", i, h, 1, layers, kind, True, b)
    if not spec.gated_mlp:
        return [LinearModule(f"{prefix}.up_proj", h, i, 1, layers, kind, True, b), down]
    if spec.fused_gate_up:  # Phi3MLP.gate_up_proj: [2I, H]
        return [LinearModule(f"{prefix}.gate_up_proj", h, 2 * i, 1, layers, kind, True, b), down]
    return [LinearModule(f"{prefix}.gate_proj", h, i, 1, layers, kind, True, b),
            LinearModule(f"{prefix}.up_proj", h, i, 1, layers, kind, True, b), down]


def _num_moe_layers(spec: ModelSpec) -> int:
    return spec.num_hidden_layers - spec.num_dense_layers if spec.is_moe else 0


@lru_cache(maxsize=256)    # pure in the spec, like linear_modules: the planner's estimates ask for it per combination
def count_params(spec: ModelSpec) -> ParamBreakdown:
    """Exact parameter count of `AutoModelForCausalLM.from_config(config)` (tied weights counted once)."""
    if spec.learned is not None:
        return learned_breakdown(spec.learned)
    h, d, L = spec.hidden_size, spec.head_dim, spec.num_hidden_layers
    mods = linear_modules(spec)

    def per_layer(kind: str) -> int:
        return sum(m.params for m in mods if m.kind == kind)

    qk_norm = 0
    if spec.qk_norm:  # Qwen3RMSNorm(head_dim) ×2 | Olmo2RMSNorm(n_h·d) + Olmo2RMSNorm(n_kv·d)
        qk_norm = 2 * d if spec.qk_norm_scope == "head" else (spec.num_attention_heads + spec.num_key_value_heads) * d
    n_moe = _num_moe_layers(spec)
    experts = per_layer("expert")
    breakdown = ParamBreakdown(
        embed=spec.vocab_size * h,
        attention_per_layer=per_layer("attention") + qk_norm,
        norms_per_layer=spec.norms_per_layer * h,
        mlp_per_layer=per_layer("mlp"),
        experts_per_layer=experts,
        router_per_layer=per_layer("router"),
        shared_expert_per_layer=per_layer("shared_expert"),
        num_layers=L, num_dense_layers=L - n_moe, num_moe_layers=n_moe,
        final_norm=h,
        lm_head=0 if spec.tie_word_embeddings else spec.vocab_size * h,
        extra=spec.extra_params,
        experts_active_per_layer=experts * spec.num_experts_per_tok // spec.num_experts if spec.is_moe else 0,
        total=_total_from_modules(spec, mods, qk_norm),
    )
    return breakdown


def _linear_kind(path: str) -> str:
    """attention | expert | shared_expert | router | mlp, from a weight's path inside the layer."""
    low = path.lower()
    if "shared" in low:
        return "shared_expert"
    if "experts" in low:
        return "expert"
    if low.endswith("gate") or "router" in low:
        return "router"
    return "attention" if "attn" in low or "attention" in low or "mixer" in low else "mlp"


def learned_linear_modules(p) -> list[LinearModule]:
    """The weights of a learned model's layers (measured on the meta model), grouped over the layers that hold them."""
    held: dict[tuple, list[int]] = {}
    for kind in p.layer_kinds:
        for lin in p.kinds[kind].linears:
            key = (lin.name, lin.in_features, lin.out_features, lin.count, lin.nn_linear, lin.bias)
            count = held.setdefault(key, [0, 0, 0])
            count[0] += 1
            count[1] += not lin.held
            count[2] += not lin.runs or lin.name in p.kinds[kind].idle_linears
    return [LinearModule(name, i, o, n, layers, _linear_kind(name), lin, bias, tied, idle)
            for (name, i, o, n, lin, bias), (layers, tied, idle) in held.items()]


def learned_breakdown(p) -> ParamBreakdown:
    """A learned model's parameters: decoder layers are counted as measured (in `extra`), per kind."""
    layers = sum(p.kinds[k].params for k in p.layer_kinds)
    inactive = sum(p.kinds[k].experts - p.kinds[k].experts_active for k in p.layer_kinds)
    return ParamBreakdown(embed=p.embed, attention_per_layer=0, norms_per_layer=0, mlp_per_layer=0,
                          experts_per_layer=0, router_per_layer=0, shared_expert_per_layer=0,
                          num_layers=p.num_layers, num_dense_layers=p.num_layers, num_moe_layers=0,
                          final_norm=p.other, lm_head=p.lm_head, extra=layers, experts_active_per_layer=0,
                          total=p.total, inactive_experts=inactive)


def _total_from_modules(spec: ModelSpec, mods: list[LinearModule], qk_norm: int) -> int:
    """The total counted a second way, module by module over all layers, so ParamBreakdown's check means something."""
    h = spec.hidden_size
    matrices = sum(m.params * m.num_layers for m in mods)
    norms = spec.num_hidden_layers * (spec.norms_per_layer * h + qk_norm) + h
    embeddings = spec.vocab_size * h * (1 if spec.tie_word_embeddings else 2)
    return matrices + norms + embeddings + spec.extra_params


# peft 0.21.2 peft/utils/constants.py TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING, for the model_types hpcmem
# reads (None: peft has no entry, and get_peft_model raises "Please specify `target_modules` or `target_parameters`").
# tests/models/test_models_torch.py checks this table against the installed peft.
PEFT_DEFAULT_TARGETS: dict[str, tuple[str, ...] | None] = {
    "llama": ("q_proj", "v_proj"),
    "mistral": ("q_proj", "v_proj"),
    "qwen2": ("q_proj", "v_proj"),
    "qwen3": ("q_proj", "v_proj"),
    "gemma2": ("q_proj", "v_proj"),
    "gemma3_text": ("q_proj", "v_proj"),
    "mixtral": ("q_proj", "v_proj"),
    "gemma3": None,
    "exaone": None,
    "internlm3": None,
    "iquestcoder": None,
    "phi3": None,
    "glm4": None,
    "olmo2": None,
    "qwen2_moe": None,
    "qwen3_moe": None,
    # peft 0.21 utils/constants.py TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING has no qwen2_5_vl, qwen2_vl or
    # qwen3_vl (nor qwen3_vl_moe) row: get_peft_model raises without target_modules
    "qwen2_5_vl": None,
    "qwen2_vl": None,
    "qwen3_vl": None,
    "qwen3_vl_moe": None,
    # nor a shieldgemma2 or cosmos3_omni row (the loaded model's model_type: ShieldGemma2Config's, Cosmos3OmniConfig's)
    "shieldgemma2": None,
    "cosmos3_omni": None,
}


# Types whose default peft 0.21.2 loses: its transformers-v5 MoE conversion (peft/utils/transformers_weight_conversion.py
# _convert_peft_config_moe, for the types of its _MOE_FUSED_TARGETS) sets an unset target_modules to an empty set before
# LoraModel._prepare_adapter_config looks the default up, so get_peft_model raises NoMatchingPeftModuleError.
PEFT_DEFAULT_LOST = frozenset({"mixtral"})


def peft_model_type(spec: ModelSpec) -> str:
    """The model_type peft looks up: the loaded model's own (the wrapper's, for a gemma3 with a text_config)."""
    return spec.wrapper_model_type or spec.model_type


def peft_default_targets(model_type: str | ModelSpec) -> tuple[str, ...]:
    """peft's default LoRA target_modules for this architecture (what an empty lora_target_modules means)."""
    if not isinstance(model_type, str):       # a spec: a learned profile carries peft's mapping as it was learned
        spec = model_type
        if spec.learned is None:
            return peft_default_targets(peft_model_type(spec))
        if spec.learned.peft_default_targets is None:
            raise SpecError(f"peft has no default LoRA target_modules for model_type {spec.model_type!r}: "
                            "get_peft_model would raise. Set lora_target_modules (e.g. all-linear).")
        return spec.learned.peft_default_targets
    if model_type not in PEFT_DEFAULT_TARGETS:
        raise SpecError(f"no peft default LoRA targets recorded for model_type {model_type!r}; known: "
                        f"{', '.join(sorted(PEFT_DEFAULT_TARGETS))}. Set lora_target_modules explicitly.")
    if model_type in PEFT_DEFAULT_LOST:
        raise SpecError(f"peft 0.21.2 drops its default LoRA target_modules for model_type {model_type!r} (its MoE "
                        "conversion empties them first): get_peft_model would raise. Set lora_target_modules (e.g. "
                        "q_proj,k_proj,v_proj,o_proj).")
    targets = PEFT_DEFAULT_TARGETS[model_type]
    if targets is None:
        raise SpecError(f"peft has no default LoRA target_modules for model_type {model_type!r}: get_peft_model would "
                        "raise. Set lora_target_modules (e.g. all-linear, or the names in `hpcmem models show`).")
    return targets


def all_linear_targets(spec: ModelSpec) -> tuple[str, ...]:
    """Leaf names peft's "all-linear" selects in the decoder layers: every nn.Linear except the output layer
    (peft/tuners/tuners_utils.py _maybe_include_all_linear_layers). Fused experts and the router are not nn.Linear."""
    return tuple(dict.fromkeys(m.leaf for m in linear_modules(spec) if m.nn_linear))


SIZED_MODULES = ("lm_head", "embed_tokens", "score")       # lora_modules_to_save names hpcmem sizes


def parameter_key(mod: LinearModule) -> str:
    """`<module>.<parameter>` of a weight inside the layer, what peft matches target_parameters against: an
    nn.Linear's or a router's is `<name>.weight`; a fused expert stack (and a learned bare weight) is named by its
    parameter already (`mlp.experts.gate_up_proj`)."""
    if (mod.nn_linear or mod.kind == "router") and not mod.name.endswith(".weight"):
        return f"{mod.name}.weight"
    return mod.name


def parameters_named(spec: ModelSpec, names: tuple[str, ...]) -> tuple[LinearModule, ...]:
    """The parameters a target_parameters list names: peft takes a parameter whose key is a name or ends in `.` + a
    name (peft/tuners/tuners_utils.py `_inject_parameters`), so `down_proj` takes `mlp.experts.down_proj` but not
    `mlp.shared_expert.down_proj.weight`."""
    return tuple(mod for mod in linear_modules(spec)
                 if any(parameter_key(mod) == n or parameter_key(mod).endswith(f".{n}") for n in names))

"""ModelSpec: a decoder-only transformer as its HF `config.json` describes it (frozen, keyword-only, checked on
construction). Names follow transformers' config keys; hpcmem.models.config builds one from a config dict."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

from hpcmem.errors import Problems
from hpcmem.models.params import count_params


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """A decoder-only transformer as its HF `config.json` describes it (names follow transformers' config keys)."""

    name: str
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    tie_word_embeddings: bool
    hidden_act: str = "silu"
    qkv_bias: bool = False          # q/k/v projections carry a bias (Qwen2)
    o_bias: bool = False
    mlp_bias: bool = False
    gated_mlp: bool = True          # gate/up/down (SwiGLU/GeGLU); False: up/down only
    qk_norm: bool = False           # per-head RMSNorm on q and k (Qwen3, Gemma3)
    norms_per_layer: int = 2        # 2 (Llama) or 4 (Gemma2/3 sandwich norms)
    # Mixture of experts (0 experts means dense). Names follow Qwen/Mixtral configs.
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    shared_expert_gate: bool = False
    num_dense_layers: int = 0       # MoE layers with a dense MLP instead (leading, or Qwen's mlp_only_layers/sparse step)
    max_position_embeddings: int = 4096
    extra_params: int = 0           # parameters the formula does not place (architecture quirks), counted verbatim
    # Layout quirks, set by hpcmem.models.config (transformers 5.24 modeling_<type>.py)
    qk_norm_scope: Literal["head", "proj"] = "head"  # RMSNorm over head_dim (Qwen3, Gemma3) or all heads (OLMo2)
    fused_qkv: bool = False         # one qkv_proj Linear instead of q/k/v_proj (Phi-3); same weight count
    fused_gate_up: bool = False     # one gate_up_proj Linear instead of gate/up_proj (Phi-3, GLM-4); same weight count
    rope_cat: bool = False          # q and k leave RoPE through torch.cat (GLM-4's partial rotary): contiguous per head
    final_logit_softcapping: float = 0.0   # tanh cap on logits, 0: none (Gemma2 30.0: extra logits-sized tensors)
    attn_logit_softcapping: float = 0.0    # tanh cap on scores, 0: none (Gemma2 50.0: no sdpa, eager attention)
    wrapper_model_type: str = ""    # outer model_type of a config with text_config (gemma3): its towers are not counted
    sliding_window: int = 0         # a window some layer attends within (0: every layer sees the whole sequence)
    sliding_layers: tuple[int, ...] = ()    # the layers that attend within it (hpcmem.models.config.sliding_layers)
    # The checkpoint's dtype as config.json names it (`dtype`, else the older `torch_dtype`): what from_pretrained
    # loads under dtype="auto"; None when config.json says nothing
    dtype: str | None = None
    # Where `dtype` was read when config.json names none (a local checkpoint's safetensors header,
    # hpcmem.models.checkpoint), or why it could not be; "" when config.json named it or no checkpoint was looked at
    dtype_source: str = field(default="", compare=False)
    # A learned profile (hpcmem.models.profile.LearnedProfile) when no family descriptor covers the model type: its
    # parameter layout and per-layer terms replace the derived ones (the estimate says so)
    learned: Any = field(default=None, compare=False, repr=False)
    # A vision-language model's vision tower and projector (hpcmem.models.vision_spec.VisionSpec); the fields above then
    # describe its language model (text_config). None for a text-only model.
    vision: Any = None

    def __post_init__(self) -> None:
        p = Problems()
        for f in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                  "head_dim"):
            p.check(getattr(self, f) > 0, f"model {self.name}: {f} must be > 0, got {getattr(self, f)}")
        if self.num_key_value_heads > 0:
            p.check(self.num_attention_heads % self.num_key_value_heads == 0,
                    f"model {self.name}: num_attention_heads {self.num_attention_heads} is not a multiple of "
                    f"num_key_value_heads {self.num_key_value_heads}")
        if self.num_experts:
            p.check(0 < self.num_experts_per_tok <= self.num_experts,
                    f"model {self.name}: num_experts_per_tok {self.num_experts_per_tok} must be in 1..{self.num_experts}")
            p.check(self.moe_intermediate_size > 0, f"model {self.name}: an MoE needs moe_intermediate_size > 0")
        p.check(self.qk_norm_scope in ("head", "proj"),
                f"model {self.name}: qk_norm_scope must be head or proj; got {self.qk_norm_scope!r}")
        p.check(0 <= self.num_dense_layers <= self.num_hidden_layers,
                f"model {self.name}: num_dense_layers {self.num_dense_layers} must be in 0..{self.num_hidden_layers}")
        p.raise_if_any()

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @cached_property
    def num_params(self) -> int:
        return count_params(self).total

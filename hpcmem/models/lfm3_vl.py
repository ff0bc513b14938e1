"""Lfm3VlTowerSpec: LFM3-VL's (model_type "lfm3_vl") hybrid tower of gated 2-D convolution and attention layers and
its LayerNorm/GELU projector, as its config.json's `vision_config` and outer keys describe them, their linears and
parameter count (transformers 5.24 models/lfm3_vl/).

What it shares and what it does not (modular_lfm3_vl.py):
- The config: `Lfm3VlVisionConfig(Qwen3VLVisionConfig)` keeps Qwen3-VL's patching fields (in_channels 3, patch_size
  16, spatial_merge_size 2, temporal_patch_size 2) and drops depth / num_heads / out_hidden_size /
  num_position_embeddings / deepstack_visual_indexes; its own defaults: hidden_size 1024, intermediate_size 2560,
  num_hidden_layers 14, num_attention_heads 16, num_key_value_heads 8, conv_kernel_size 3, norm_eps 1e-5,
  layer_types "conv" for layers 0, 1 and every odd one, else "full_attention" (`__post_init__`). `Lfm3VlConfig`:
  an omitted text_config is an `lfm3` (Lfm3Config, learned: hpcmem.models.vlm_learned), projector_hidden_size 4096,
  projector_bias true, projector_hidden_act "gelu", tie_word_embeddings true.
- The tower (`Lfm3VlVisionModel`, on Qwen2VisionTransformerPretrainedModel's frame but none of its blocks or merger):
  `patch_embed` an nn.Linear(3 · 2 · 16² → width, no bias) (not Qwen's Conv3d), `embedding_norm` an RMSNorm, 2-D
  rotary tables, then `num_hidden_layers` `Lfm3VlVisionLayer`s — LFM2's decoder layer (modeling_lfm2.py
  `Lfm2DecoderLayer`: operator_norm RMSNorm → the operator → residual, ffn_norm RMSNorm → SwiGLU `feed_forward`
  w1/w3/w2 without biases (Lfm3MLP) → residual) whose operator is `Lfm3VlVisionAttention` (q/k/v/out_proj without
  biases, grouped key/value heads, q_norm/k_norm RMSNorms over head_dim = width / heads, rotary, bidirectional SDPA per
  image) on "full_attention" layers and `Lfm3VlVisionShortConv` (in_proj width → 3 · width, the input gate times the
  conv input, a depthwise Conv2d of conv_kernel_size² over each image's patch grid without bias, the output gate,
  out_proj) on "conv" layers. No final norm: `last_hidden_state` is the last layer's output.
- The projector (`Lfm3VlMultiModalProjector`): LayerNorm over the tower width (eps 1e-6) on every patch, each
  spatial_merge_size² block reshaped to 4 · width, linear_1 (→ projector_hidden_size) → GELU → linear_2 (→ text
  width), biases when projector_bias. No deepstack mergers, no extra projector.
- The processor (processing_lfm3_vl.py `Lfm3VlProcessor`, Qwen3-VL's): images_auto maps lfm3_vl to Qwen2-VL's image
  processor (image_processing_auto.py), smart_resize with factor patch · merge (32) and min/max pixels (hpcmem.job.
  images' Qwen path), patches / merge² image tokens per image (`replace_image_token`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpcmem.errors import Problems, SpecError
from hpcmem.models.tower_base import TowerBase, TowerLinear, check_counts, check_heads, text_width, vision_values

# configuration_lfm3_vl.py `Lfm3VlVisionConfig`'s field defaults
LFM3_VL_VISION_DEFAULTS: dict[str, Any] = {
    "hidden_size": 1024, "intermediate_size": 2560, "num_hidden_layers": 14, "num_attention_heads": 16,
    "num_key_value_heads": 8, "in_channels": 3, "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
    "conv_kernel_size": 3, "layer_types": None}
# `Lfm3VlConfig`'s own defaults
LFM3_VL_DEFAULTS: dict[str, Any] = {"projector_hidden_act": "gelu", "projector_hidden_size": 4096,
                                    "projector_bias": True}
LFM3_HIDDEN = 2048          # Lfm3Config.hidden_size: the text width of an omitted text_config


def default_layer_types(depth: int) -> tuple[str, ...]:
    """`Lfm3VlVisionConfig.__post_init__`: "conv" for layers 0, 1 and every odd one, else "full_attention"."""
    return tuple("conv" if i < 2 or i % 2 else "full_attention" for i in range(depth))


@dataclass(frozen=True, kw_only=True)
class Lfm3VlTowerSpec(TowerBase):
    """LFM3-VL's conv/attention tower over Qwen-style patches, under its LayerNorm/GELU projector."""

    spatial_merge_size: int
    temporal_patch_size: int
    num_key_value_heads: int
    conv_kernel_size: int
    layer_types: tuple[str, ...]
    projector_hidden: int       # projector_hidden_size: linear_1's output
    projector_bias: bool
    projector_act: str = "gelu"
    hidden_act: str = "silu"    # Lfm3MLP's SiLU gate
    norm: str = "rms"           # Lfm3RMSNorm (hpcmem.estimate.vision `block_saved`)
    mlp: str = "gated"          # Lfm3MLP: w2(silu(w1 x) · w3 x)
    family: str = "lfm3_vl"
    image_size: int = 0         # no fixed resize: Qwen2-VL's smart_resize (hpcmem.job.images)
    fixed_resolution: bool = False
    hooked_input: bool = True   # Lfm3VlVisionModel `_input_embed_layer = "patch_embed"`
    deepstack_visual_indexes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        p = Problems()
        check_counts(p, self, ("depth", "hidden_size", "intermediate_size", "num_heads", "in_channels", "patch_size",
                               "spatial_merge_size", "temporal_patch_size", "num_key_value_heads", "conv_kernel_size",
                               "projector_hidden"))
        p.raise_if_any()
        check_heads(p, self.hidden_size, self.num_heads, "num_attention_heads")
        p.check(self.num_heads % self.num_key_value_heads == 0,
                f"vision_config.num_key_value_heads {self.num_key_value_heads} must divide num_attention_heads "
                f"{self.num_heads}")
        p.check(len(self.layer_types) == self.depth and set(self.layer_types) <= {"conv", "full_attention"},
                f"vision_config.layer_types must name \"conv\" or \"full_attention\" for each of the {self.depth} "
                f"layers, got {list(self.layer_types)}")
        p.check(self.conv_kernel_size % 2 == 1, f"vision_config.conv_kernel_size {self.conv_kernel_size} must be odd "
                "(Lfm3VlVisionShortConv pads kernel // 2 a side: an even kernel changes the grid)")
        p.raise_if_any()

    @property
    def attention_layers(self) -> int:
        return sum(1 for x in self.layer_types if x == "full_attention")

    @property
    def conv_layers(self) -> int:
        return self.depth - self.attention_layers

    @property
    def head_dim(self) -> int:
        """Qwen3VLVisionAttention's head_dim: width / num_attention_heads."""
        return self.hidden_size // self.num_heads

    @property
    def kv_heads(self) -> int:
        return self.num_key_value_heads

    @property
    def merge_unit(self) -> int:
        return self.spatial_merge_size ** 2

    @property
    def patch_dim(self) -> int:
        """Values per patch row: in_channels × temporal_patch_size × patch_size² (the patch_embed Linear's input)."""
        return self.in_channels * self.temporal_patch_size * self.patch_size ** 2

    @property
    def merged_width(self) -> int:
        """`Lfm3VlMultiModalProjector.merged_hidden_size`: width · spatial_merge_size²."""
        return self.hidden_size * self.merge_unit

    def linears(self) -> tuple[TowerLinear, ...]:
        """Every nn.Linear (peft's "all-linear" wraps each), names below `vision_tower.` / `multi_modal_projector.`:
        the attention layers' self_attn.q/k/v/out_proj, the conv layers' conv.in_proj / conv.out_proj, every layer's
        feed_forward.w1/w3/w2 (none with a bias), the patch embedding (part "embed") and the projector's two."""
        h, i, a, c = self.hidden_size, self.intermediate_size, self.attention_layers, self.conv_layers
        q, kv = self.num_heads * self.head_dim, self.num_key_value_heads * self.head_dim
        attn = (TowerLinear(name="self_attn.q_proj", in_features=h, out_features=q, count=a, part="tower", bias=False),
                TowerLinear(name="self_attn.k_proj", in_features=h, out_features=kv, count=a, part="tower", bias=False),
                TowerLinear(name="self_attn.v_proj", in_features=h, out_features=kv, count=a, part="tower", bias=False),
                TowerLinear(name="self_attn.out_proj", in_features=q, out_features=h, count=a, part="tower",
                            bias=False)) if a else ()
        conv = (TowerLinear(name="conv.in_proj", in_features=h, out_features=3 * h, count=c, part="tower", bias=False),
                TowerLinear(name="conv.out_proj", in_features=h, out_features=h, count=c, part="tower",
                            bias=False)) if c else ()
        return (*attn, *conv,
                TowerLinear(name="feed_forward.w1", in_features=h, out_features=i, count=self.depth, part="tower",
                            bias=False),
                TowerLinear(name="feed_forward.w3", in_features=h, out_features=i, count=self.depth, part="tower",
                            bias=False),
                TowerLinear(name="feed_forward.w2", in_features=i, out_features=h, count=self.depth, part="tower",
                            bias=False),
                TowerLinear(name="patch_embed", in_features=self.patch_dim, out_features=h, count=1, part="embed",
                            bias=False),
                TowerLinear(name="linear_1", in_features=self.merged_width, out_features=self.projector_hidden,
                            count=1, part="merger", bias=self.projector_bias),
                TowerLinear(name="linear_2", in_features=self.projector_hidden, out_features=self.out_hidden_size,
                            count=1, part="merger", bias=self.projector_bias))

    @property
    def attention_params(self) -> int:
        """One attention layer: its four linears, q_norm and k_norm (head_dim each), two RMSNorms, the MLP."""
        return self._layer_params("self_attn.") + 2 * self.head_dim

    @property
    def conv_params(self) -> int:
        """One conv layer: in_proj, the depthwise Conv2d (width · kernel², no bias), out_proj, two RMSNorms, the
        MLP."""
        return self._layer_params("conv.") + self.hidden_size * self.conv_kernel_size ** 2

    def _layer_params(self, operator: str) -> int:
        own = sum(x.params // x.count for x in self.linears() if x.name.startswith((operator, "feed_forward.")))
        return own + 2 * self.hidden_size

    @property
    def embed_params(self) -> int:
        """patch_embed and embedding_norm."""
        return self.patch_dim * self.hidden_size + self.hidden_size

    @property
    def block_params(self) -> int:
        """The widest layer's parameters (attention or conv)."""
        return max(self.attention_params if self.attention_layers else 0, self.conv_params if self.conv_layers else 0)

    @property
    def tower_params(self) -> int:
        return (self.embed_params + self.attention_layers * self.attention_params
                + self.conv_layers * self.conv_params)

    @property
    def merger_params(self) -> int:
        """The projector's LayerNorm over the tower width (weight and bias) and its two linears."""
        return 2 * self.hidden_size + sum(x.params for x in self.linears() if x.part == "merger")

    @property
    def num_params(self) -> int:
        return self.tower_params + self.merger_params


def lfm3_vl_tower_from_config(cfg: dict[str, Any], name: str) -> Lfm3VlTowerSpec:
    """The Lfm3VlTowerSpec of an lfm3_vl config.json dict; keys it omits take the config classes' defaults."""
    vc = vision_values(cfg, name, LFM3_VL_VISION_DEFAULTS)
    if vc.get("model_type", "lfm3_vl_vision") != "lfm3_vl_vision":
        raise SpecError(f"model {name}: lfm3_vl's vision_config.model_type {vc.get('model_type')!r} is not modelled; "
                        "hpcmem models lfm3_vl with its own tower (lfm3_vl_vision)")
    for key in ("patch_size", "temporal_patch_size"):
        if isinstance(vc[key], (list, tuple)):
            raise SpecError(f"model {name}: vision_config.{key} {vc[key]!r}: hpcmem models square patches (an "
                            "integer)")
    depth = vc["num_hidden_layers"]
    types = vc["layer_types"]
    types = default_layer_types(depth) if types is None and isinstance(depth, int) else tuple(types or ())
    outer = {**LFM3_VL_DEFAULTS, **{k: cfg[k] for k in LFM3_VL_DEFAULTS if k in cfg}}
    if outer["projector_hidden_act"] != "gelu":
        raise SpecError(f"model {name}: projector_hidden_act {outer['projector_hidden_act']!r}: what the projector "
                        "keeps for backward is derived for gelu only (Lfm3VlConfig's default)")
    return Lfm3VlTowerSpec(
        model_type="lfm3_vl", depth=depth, hidden_size=vc["hidden_size"], intermediate_size=vc["intermediate_size"],
        num_heads=vc["num_attention_heads"], num_key_value_heads=vc["num_key_value_heads"],
        in_channels=vc["in_channels"], patch_size=vc["patch_size"], spatial_merge_size=vc["spatial_merge_size"],
        temporal_patch_size=vc["temporal_patch_size"], conv_kernel_size=vc["conv_kernel_size"], layer_types=types,
        out_hidden_size=text_width(cfg, LFM3_HIDDEN), projector_hidden=outer["projector_hidden_size"],
        projector_bias=bool(outer["projector_bias"]), projector_act=str(outer["projector_hidden_act"]))

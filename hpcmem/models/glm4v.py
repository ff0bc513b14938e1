"""Glm4vTowerSpec: GLM-4.1V's (model_type "glm4v"; "glm46v" and "glmga" build the same classes from glm4v_vision /
glm4v_text sub-configs) vision tower and
patch merger, as its config.json's `vision_config` describes them, their linear layers and parameter count
(transformers 5.24 models/glm4v/modeling_glm4v.py), and the image processor's resize (image_processing_glm4v.py
`smart_resize`). hpcmem.models.vision registers it for glm4v; hpcmem.estimate.vision_glm4v sizes what its forward
keeps.

- `Glm4vVisionModel.__init__`: `patch_embed` a Conv3d (in_channels → hidden_size, kernel temporal_patch_size ×
  patch_size², bias), `embeddings` an nn.Embedding of (image_size / patch_size)² rows (the position table
  `Glm4vVisionEmbeddings.forward` resamples per image), `post_conv_layernorm`, `post_layernorm` (RMSNorms), `downsample`
  a Conv2d (hidden_size → out_hidden_size, kernel spatial_merge_size, bias), `merger`.
- `Glm4vVisionBlock`: norm1, norm2 (RMSNorm), `attn.qkv` (bias: config.attention_bias), `attn.proj` (no bias),
  `Glm4VisionMlp(bias=False)` gate/up/down_proj whose width is out_hidden_size (`self.intermediate_size =
  config.out_hidden_size`), not intermediate_size.
- `Glm4vVisionPatchMerger(dim=out_hidden_size, context_dim=intermediate_size, bias=False)`: proj, post_projection_norm
  (LayerNorm, weight and bias), gate/up/down_proj at intermediate_size.
- `Glm4vVisionModel` names no `_input_embed_layer` and no `embed_tokens`, so `get_input_embeddings` finds none and
  `enable_input_require_grads` (modeling_utils.py) does not hook the tower (`hooked_input` False, as Qwen3-VL's).
- The image processor (image_processing_glm4v.py `Glm4vImageProcessor`, its PIL twin the same): `size` shortest_edge
  112·112 and longest_edge 28·28·15000 pixels, a still image taken as temporal_patch_size frames (`num_frames=
  temporal_factor`), sides rounded to patch_size · merge_size; the processor (processing_glm4v.py
  `replace_image_token`) writes grid_t·grid_h·grid_w / merge_size² `<|image|>` tokens between the chat template's
  `<|begin_of_image|>` and `<|end_of_image|>`.

GlmOcrTowerSpec: GLM-OCR's (model_type "glm_ocr"; transformers 5.24 models/glm_ocr/modeling_glm_ocr.py) tower, a
Glm4vVisionModel with these differences (`GlmOcrVisionModel.__init__` deletes `embeddings` and
`post_conv_layernorm`):
- no position table and no post-conv RMSNorm: the patch embedding feeds the first block directly;
- `GlmOcrVisionAttention`: qkv and proj both follow attention_bias (GlmOcrVisionConfig default True), and q_norm /
  k_norm, RMSNorms over head_dim applied to q and k before the 2-D rotary;
- `GlmOcrVisionMlp(bias=attention_bias)` at intermediate_size (glm4v's runs at out_hidden_size);
- `GlmOcrVisionPatchMerger(dim=out_hidden_size, context_dim=out_hidden_size · in_channels)`: the merger's gated MLP is
  out_hidden_size · in_channels wide, not intermediate_size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpcmem.errors import SpecError
from hpcmem.models.tower_base import TowerBase, TowerLinear, fit_pixels, grid_patches

# configuration_glm4v.py `Glm4vVisionConfig` field defaults (the GLM-4.1V-9B tower)
GLM4V_VISION_DEFAULTS: dict[str, Any] = {
    "depth": 24, "hidden_size": 1536, "hidden_act": "silu", "attention_bias": False, "num_heads": 12,
    "in_channels": 3, "image_size": 336, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2,
    "out_hidden_size": 4096, "intermediate_size": 13696}
# image_processing_glm4v.py `Glm4vImageProcessor.size`: what min_pixels / max_pixels None stand for
GLM4V_MIN_PIXELS = 112 * 112
GLM4V_MAX_PIXELS = 28 * 28 * 15000
# types whose config builds its parts by sub-config model_type (modular_glm46v.py `Glm46VConfig`, modular_glmga.py
# `GlmgaConfig(Glm46VConfig)`), and the types of glm4v's own classes
GLM46V_TYPES = ("glm46v", "glmga")
SUB_CONFIG_TYPES = {"vision_config": "glm4v_vision", "text_config": "glm4v_text"}
# the MoE text sub-config GLM-4.6V's checkpoints name (GLM-4.5V's decoder; hpcmem.models.vision SUB_CONFIG_LAYOUTS)
MOE_TEXT_TYPE = "glm4v_moe_text"
# configuration_glm4v.py `Glm4vTextConfig` field defaults, what a text_config key it omits takes (hpcmem builds the
# decoder with the glm4 layout: Glm4vTextDecoderLayer is Glm4DecoderLayer's computation). Glm4vTextAttention hard-codes
# q/k/v bias on and o_proj's off and reads head_dim as hidden_size // num_attention_heads whatever the config says
GLM4V_TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 151552, "hidden_size": 4096, "intermediate_size": 13696, "num_hidden_layers": 40,
    "num_attention_heads": 32, "num_key_value_heads": 2, "hidden_act": "silu", "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-05, "attention_bias": True, "head_dim": None}
# configuration_glm_ocr.py `GlmOcrVisionConfig` / `GlmOcrTextConfig` field defaults (the GLM-OCR 0.9B model). The text
# model is Glm4vTextModel's computation with `GlmOcrTextAttention`, which builds q/k/v_proj without bias whatever
# attention_bias says (`GLM_OCR_TEXT_FORCED`) and takes head_dim from the config when it names one, else
# hidden_size // num_attention_heads
GLM_OCR_VISION_DEFAULTS: dict[str, Any] = {
    **GLM4V_VISION_DEFAULTS, "hidden_size": 1024, "attention_bias": True, "num_heads": 16, "out_hidden_size": 1536,
    "intermediate_size": 4096}
GLM_OCR_TEXT_DEFAULTS: dict[str, Any] = {
    **GLM4V_TEXT_DEFAULTS, "vocab_size": 59392, "hidden_size": 1024, "intermediate_size": 4096,
    "num_hidden_layers": 16, "num_attention_heads": 16, "num_key_value_heads": 8, "max_position_embeddings": 131072}
GLM_OCR_TEXT_FORCED: dict[str, Any] = {"attention_bias": False}
# configuration_glm4v_moe.py `Glm4vMoeTextConfig(Glm4MoeConfig)` field defaults (GLM-4.5V's decoder): what a key the
# text_config omits takes. It names no head_dim: Glm4Attention then reads hidden_size // num_attention_heads (GLM-4.5V's
# config.json names 128)
GLM4V_MOE_TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 151424, "hidden_size": 4096, "intermediate_size": 10944, "num_hidden_layers": 46,
    "num_attention_heads": 96, "num_key_value_heads": 8, "hidden_act": "silu", "max_position_embeddings": 65536,
    "rms_norm_eps": 1e-05, "attention_bias": True, "moe_intermediate_size": 1408, "num_experts_per_tok": 8,
    "n_shared_experts": 1, "n_routed_experts": 128, "routed_scaling_factor": 1.0, "n_group": 1, "topk_group": 1,
    "first_k_dense_replace": 1, "norm_topk_prob": True, "head_dim": None}
# Glm4vMoeTextConfig.router_aux_loss_coef's default: what TRL reads when neither the job nor the config names one
GLM4V_MOE_AUX_LOSS_DEFAULT = 0.0001


def glm4v_resize(height: int, width: int, factor: int, temporal_factor: int, min_pixels: int,
                 max_pixels: int) -> tuple[int, int]:
    """transformers 5.24 models/glm4v/image_processing_glm4v.py `smart_resize` for a still image (num_frames =
    temporal_factor, as `Glm4vImageProcessor.resize` calls it): a side under `factor` scaled up first, both sides
    rounded to multiples of `factor`, then scaled (aspect kept) so that frames · height · width lies in
    [min_pixels, max_pixels] — the Qwen scaling step (`fit_pixels`) with the bounds per frame."""
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    return fit_pixels(height, width, round(height / factor) * factor, round(width / factor) * factor, factor,
                      min_pixels / temporal_factor, max_pixels / temporal_factor)


@dataclass(frozen=True, kw_only=True)
class Glm4vTowerSpec(TowerBase):
    """GLM-4.1V's tower: `hidden_size` its width, `out_hidden_size` the block MLP's and the merger's width (the text
    width), `intermediate_size` the merger's gated MLP."""

    table_image_size: int       # vision_config.image_size: the position table's side in pixels, not a resize
    spatial_merge_size: int
    temporal_patch_size: int
    attention_bias: bool = False
    qk_norm: bool = False       # q_norm / k_norm over head_dim in every block's attention (GLM-OCR's)
    # a GLM-4.5 MoE decoder's (glm4v_moe, or glm46v / glmga over glm4v_moe_text): its text config's
    # router_aux_loss_coef, which TRL takes when the job names none (hpcmem.job.image_rules `aux_loss_problems`); the
    # decoder built as glm4_moe's has no such field. None: a dense decoder
    text_aux_loss_coef: float | None = None
    family: str = "glm4v"
    # what hpcmem.estimate.vision's Qwen-tower terms read: RMSNorm blocks, a gated MLP, full attention per image,
    # no deepstack mergers, a tower enable_input_require_grads does not hook
    norm: str = "rms"
    mlp: str = "gated"
    window_size: int = 0
    fullatt_block_indexes: tuple[int, ...] = ()
    deepstack_visual_indexes: tuple[int, ...] = ()
    hooked_input: bool = False
    image_size: int = 0         # no fixed square resize (hpcmem.job.images): the processor's smart_resize
    default_pixels: tuple[int, int] = (GLM4V_MIN_PIXELS, GLM4V_MAX_PIXELS)

    @property
    def merge_unit(self) -> int:
        """Patches the downsample Conv2d merges into one language-model token (spatial_merge_size²)."""
        return self.spatial_merge_size ** 2

    @property
    def block_mlp_width(self) -> int:
        """The block MLP's width: out_hidden_size (`Glm4VisionMlp.__init__`: `self.intermediate_size =
        config.out_hidden_size`)."""
        return self.out_hidden_size

    @property
    def merger_width(self) -> int:
        """The merger's gated MLP width: intermediate_size (`Glm4vVisionPatchMerger(context_dim=...)`)."""
        return self.intermediate_size

    def resized(self, height: int, width: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
        """The image's size after the image processor's resize (`glm4v_resize`)."""
        return glm4v_resize(height, width, self.patch_size * self.spatial_merge_size, self.temporal_patch_size,
                            min_pixels, max_pixels)

    @property
    def patch_dim(self) -> int:
        """Values per patch row of pixel_values: in_channels × temporal_patch_size × patch_size² (the Conv3d)."""
        return self.in_channels * self.temporal_patch_size * self.patch_size ** 2

    def linears(self) -> tuple[TowerLinear, ...]:
        h, o, i, d = self.hidden_size, self.out_hidden_size, self.merger_width, self.depth
        b, w, mb = self.attention_bias, self.block_mlp_width, self.block_mlp_bias
        return (TowerLinear(name="attn.qkv", in_features=h, out_features=3 * h, count=d, part="tower", bias=b),
                TowerLinear(name="attn.proj", in_features=h, out_features=h, count=d, part="tower",
                            bias=self.proj_bias),
                TowerLinear(name="mlp.gate_proj", in_features=h, out_features=w, count=d, part="tower", bias=mb),
                TowerLinear(name="mlp.up_proj", in_features=h, out_features=w, count=d, part="tower", bias=mb),
                TowerLinear(name="mlp.down_proj", in_features=w, out_features=h, count=d, part="tower", bias=mb),
                TowerLinear(name="proj", in_features=o, out_features=o, count=1, part="merger", bias=False),
                TowerLinear(name="gate_proj", in_features=o, out_features=i, count=1, part="merger", bias=False),
                TowerLinear(name="up_proj", in_features=o, out_features=i, count=1, part="merger", bias=False),
                TowerLinear(name="down_proj", in_features=i, out_features=o, count=1, part="merger", bias=False))

    @property
    def embed_params(self) -> int:
        """The tower's parameters outside its blocks: patch embedding (Conv3d with bias), position table,
        post_conv_layernorm, post_layernorm and the downsample Conv2d (with bias)."""
        h, o, s = self.hidden_size, self.out_hidden_size, self.spatial_merge_size
        embed = self.patch_dim * h + h + grid_patches(self.table_image_size, self.patch_size) * h
        return embed + 2 * h + h * o * s * s + o

    @property
    def proj_bias(self) -> bool:
        """attn.proj's bias: none in glm4v's `Glm4vVisionAttention`."""
        return False

    @property
    def block_mlp_bias(self) -> bool:
        """The block MLP's biases: none (`Glm4VisionMlp(bias=False)`)."""
        return False

    @property
    def block_params(self) -> int:
        """One block's parameters: its linears and two RMSNorms (and q_norm / k_norm over head_dim where it has them)."""
        qk = 2 * (self.hidden_size // self.num_heads) if self.qk_norm else 0
        return sum(x.params for x in self.linears() if x.part == "tower") // self.depth + 2 * self.hidden_size + qk

    @property
    def tower_params(self) -> int:
        return self.embed_params + self.block_params * self.depth

    @property
    def deepstack_params(self) -> int:
        """No deepstack mergers (Qwen3-VL's; hpcmem.estimate.vision reads the count)."""
        return 0

    @property
    def merger_params(self) -> int:
        """The merger's linears and its LayerNorm (weight and bias) over out_hidden_size."""
        return sum(x.params for x in self.linears() if x.part == "merger") + 2 * self.out_hidden_size

    @property
    def num_params(self) -> int:
        return self.tower_params + self.merger_params


def glm4v_tower_from_config(cfg: dict[str, Any], name: str) -> Glm4vTowerSpec:
    """The Glm4vTowerSpec of a glm4v / glm46v / glmga config.json dict; keys vision_config omits take
    Glm4vVisionConfig's defaults. glm46v and glmga build their sub-configs by model_type (`Glm46VConfig`
    sub_configs_defaults, `Glm46VModel.__init__`: `AutoModel.from_config`): glm4v_vision, and glm4v_text or
    glm4v_moe_text (GLM-4.5V's MoE decoder, which GLM-4.6V's released checkpoints name); another type is refused.
    glm_ocr: a GlmOcrTowerSpec with GlmOcrVisionConfig's defaults; glm4v_moe (GLM-4.5V): glm4v's tower
    (`Glm4vMoeVisionModel(Glm4vVisionModel)` is a `pass` subclass, Glm4vMoeVisionConfig Glm4vVisionConfig's fields)."""
    raw = cfg.get("vision_config")
    if raw is not None and not isinstance(raw, dict):
        raise SpecError(f"model {name}: vision_config must be an object, got {type(raw).__name__}")
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {}
    moe_text = cfg.get("model_type") == "glm4v_moe"
    if cfg.get("model_type") in GLM46V_TYPES:
        moe_text = text.get("model_type") == MOE_TEXT_TYPE
        for key, expected in SUB_CONFIG_TYPES.items():
            sub = cfg.get(key)
            got = sub.get("model_type", expected) if isinstance(sub, dict) else expected
            if got != expected and not (key == "text_config" and moe_text):
                raise SpecError(f"model {name}: {cfg['model_type']} {key}.model_type {got!r}: hpcmem models "
                                f"{cfg['model_type']} with {expected} (glm4v's classes) or a {MOE_TEXT_TYPE} "
                                "text_config only")
    vc = {**GLM4V_VISION_DEFAULTS, **(raw or {})}
    if isinstance(vc["image_size"], (list, tuple)):
        raise SpecError(f"model {name}: vision_config.image_size {vc['image_size']!r}: hpcmem reads a square "
                        "position table (an integer)")
    spec_class: type[Glm4vTowerSpec] = Glm4vTowerSpec
    if cfg.get("model_type") == "glm_ocr":
        vc = {**GLM_OCR_VISION_DEFAULTS, **(raw or {})}
        spec_class = GlmOcrTowerSpec
    coef = None
    if moe_text:
        coef = text.get("router_aux_loss_coef", GLM4V_MOE_AUX_LOSS_DEFAULT)
        if isinstance(coef, bool) or not isinstance(coef, (int, float)):
            raise SpecError(f"model {name}: text_config.router_aux_loss_coef must be a number, got {coef!r}")
    return spec_class(model_type=str(cfg.get("model_type", "glm4v")), depth=vc["depth"],
                          hidden_size=vc["hidden_size"], intermediate_size=vc["intermediate_size"],
                          num_heads=vc["num_heads"], in_channels=vc["in_channels"], patch_size=vc["patch_size"],
                          out_hidden_size=vc["out_hidden_size"], hidden_act=str(vc["hidden_act"]),
                          table_image_size=vc["image_size"], spatial_merge_size=vc["spatial_merge_size"],
                          temporal_patch_size=vc["temporal_patch_size"],
                          attention_bias=bool(vc["attention_bias"]),
                          text_aux_loss_coef=None if coef is None else float(coef))


@dataclass(frozen=True, kw_only=True)
class GlmOcrTowerSpec(Glm4vTowerSpec):
    """GLM-OCR's tower (the module docstring): glm4v's blocks with q/k norms and biases, the block MLP at
    intermediate_size, no position table or post-conv norm, the merger's MLP out_hidden_size · in_channels wide."""

    qk_norm: bool = True

    @property
    def block_mlp_width(self) -> int:
        """`GlmOcrVisionMlp`: intermediate_size."""
        return self.intermediate_size

    @property
    def merger_width(self) -> int:
        """`GlmOcrVisionPatchMerger(context_dim=config.out_hidden_size * config.in_channels)`."""
        return self.out_hidden_size * self.in_channels

    @property
    def proj_bias(self) -> bool:
        """`GlmOcrVisionAttention.proj`: bias=attention_bias."""
        return self.attention_bias

    @property
    def block_mlp_bias(self) -> bool:
        """`GlmOcrVisionBlock`: `GlmOcrVisionMlp(config, bias=config.attention_bias)`."""
        return self.attention_bias

    @property
    def embed_params(self) -> int:
        """Patch embedding (Conv3d with bias), post_layernorm and the downsample Conv2d (with bias): no position
        table, no post_conv_layernorm."""
        h, o, s = self.hidden_size, self.out_hidden_size, self.spatial_merge_size
        return self.patch_dim * h + h + h + h * o * s * s + o

"""Ernie45VlTowerSpec: ERNIE-4.5-VL's (model_type "ernie4_5_vl_moe") vision tower and its variable-resolution
resampler (transformers 5.24 models/ernie4_5_vl_moe/modular_ernie4_5_vl_moe.py).

- The config: `Ernie4_5_VLMoeConfig.sub_configs_defaults` builds an omitted `vision_config` as
  `Ernie4_5_VLMoeVisionConfig` (Qwen2VLVisionConfig's fields renamed: width `hidden_size` 1280, MLP
  `intermediate_size` 5120, depth 32, 16 heads, patch 14, in_channels 3, quick_gelu, spatial_merge_size 2,
  temporal_merge_size 2, rms_norm_eps 1e-6 — the LayerNorms' eps) and an omitted `text_config` as
  `Ernie4_5_VLMoeTextConfig` (width 2560: learned, hpcmem.models.vlm_learned); tie_word_embeddings True. The class
  documents its defaults as baidu/ERNIE-4.5-VL-28B-A3B-PT's (`@auto_docstring(checkpoint=...)`).
- The tower (`Ernie4_5_VLMoeVisionTransformerPretrainedModel`): `patch_embed.proj`, an nn.Linear(3 · 14² → width, no
  bias) over the processor's flattened patches cast to its dtype; axial 2-D rotary tables (fp32 cos and sin
  [N, head_dim]); `depth` `Ernie4_5_VLMoeVisionBlock`s (Qwen2.5-VL's block with torch LayerNorms norm1/norm2, a fused
  `attn.qkv` and `attn.proj` with biases, full attention per image on the cu_seqlens splits, Qwen2-VL's two-linear
  MLP `mlp.fc1` → quick_gelu → `mlp.fc2` with biases); then `ln`, a LayerNorm over the width. No merger (`del
  self.merger`).
- The resampler (`Ernie4_5_VLMoeVariableResolutionResamplerModel`, `model.resampler_model`): the tower's output
  viewed [N / 4, 4 · width] → `spatial_linear` (`Ernie4_5_VLMoeVisionMLP`: fc1 4·width → 4·width, GELU, fc2 4·width →
  4·width, LayerNorm over 4·width, all with biases) → `_temporal_slicing` (an image, grid_t 1: its rows selected twice
  and concatenated, [N / 4, 8 · width]) → `temporal_linear` (fc1 8·width → 4·width, GELU, fc2, LayerNorm) → `mlp`
  (Linear 4·width → text width, with bias) → `after_norm` (an RMSNorm over the text width, weight only): one image
  token per 2 × 2 block.
- The processor (`Ernie4_5_VLMoeImageProcessor(Qwen2VLImageProcessor)`, its PIL twin the same): Qwen2-VL's
  `smart_resize` (factor patch · merge = 28) with temporal_patch_size 1 and size {shortest_edge 56², longest_edge
  28² · 6177}; `Ernie4_5_VLMoeProcessor.replace_image_token` writes patches / merge² image tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from hpcmem.errors import Problems, SpecError
from hpcmem.models.tower_base import (TowerBase, TowerLinear, check_activation, check_counts, check_heads,
                                      text_width, vision_values)

# modular_ernie4_5_vl_moe.py `Ernie4_5_VLMoeVisionConfig`'s field defaults (and Qwen2VLVisionConfig's it keeps)
ERNIE45VL_VISION_DEFAULTS: dict[str, Any] = {
    "depth": 32, "hidden_size": 1280, "intermediate_size": 4 * 1280, "num_heads": 16, "in_channels": 3,
    "patch_size": 14, "hidden_act": "quick_gelu", "spatial_merge_size": 2, "temporal_merge_size": 2}
ERNIE45VL_TEXT_HIDDEN = 2560            # `Ernie4_5_VLMoeTextConfig.hidden_size`: an omitted text_config's width
# `Ernie4_5_VLMoeTextConfig`'s defaults of what routes the image tokens (configuration_ernie4_5_vl_moe.py): 28 layers,
# mlp_layer_types ["dense"] + ["sparse"] · 27 (`__post_init__`), top-6 of each modality's experts, the text and
# vision experts' widths [1536, 512] (`Ernie4_5_VLMoeMoeBlock.__init__`: text_moe, vision_moe), 64 experts of each,
# router_aux_loss_coef 0.001
ERNIE45VL_TEXT_ROUTING: dict[str, Any] = {"num_hidden_layers": 28, "moe_k": 6, "moe_intermediate_size": [1536, 512],
                                          "moe_num_experts": 64, "router_aux_loss_coef": 0.001}
# `Ernie4_5_VLMoeImageProcessor.size`: (shortest_edge, longest_edge) pixels
ERNIE45VL_PIXELS = (56 * 56, 28 * 28 * 6177)
# the block MLP's activations hpcmem.estimate.vision `fc_mlp_saved` sizes (modeling_qwen2_vl.py VisionMlp's)
ERNIE45VL_ACTIVATIONS = ("quick_gelu", "gelu", "gelu_pytorch_tanh")


@dataclass(frozen=True, kw_only=True)
class Ernie45VlTowerSpec(TowerBase):
    """Qwen2-VL's blocks under a Linear patch embedding and a final LayerNorm, then the resampler's spatial and
    temporal MLPs, its projection to the text width and an RMSNorm."""

    spatial_merge_size: int
    temporal_merge_size: int
    # the decoder's MoE layers that route image tokens to the vision experts (`mlp_layer_types` "sparse"), the experts
    # each token takes (moe_k) and the text and vision experts' widths (moe_intermediate_size)
    sparse_layers: int
    moe_k: int
    text_expert_width: int
    vision_expert_width: int
    num_experts: int
    router_aux_loss_coef: float          # the text config's router_aux_loss_coef, which TRL reads
    default_pixels: tuple[int, int] = ERNIE45VL_PIXELS
    temporal_patch_size: int = 1    # the image processor's: one frame per patch row
    norm: str = "layer"             # torch LayerNorms norm1/norm2 (hpcmem.estimate.vision `block_saved`)
    mlp: str = "fc"                 # Ernie4_5VLVisionMLP: fc2(act(fc1 x))
    family: str = "ernie4_5_vl_moe"
    image_size: int = 0             # no fixed resize (hpcmem.job.images): Qwen2-VL's smart_resize
    fixed_resolution: bool = False
    hooked_input: bool = True       # `_input_embed_layer = "patch_embed"`: enable_input_require_grads hooks it
    deepstack_visual_indexes: tuple[int, ...] = ()
    activations: ClassVar[tuple[str, ...]] = ERNIE45VL_ACTIVATIONS

    def __post_init__(self) -> None:
        p = Problems()
        check_counts(p, self, ("depth", "hidden_size", "intermediate_size", "num_heads", "in_channels", "patch_size",
                               "spatial_merge_size", "temporal_merge_size", "out_hidden_size", "moe_k",
                               "text_expert_width", "vision_expert_width", "num_experts"))
        p.check(isinstance(self.sparse_layers, int) and self.sparse_layers >= 0,
                f"text_config.mlp_layer_types must name whole sparse layers, got {self.sparse_layers!r}")
        check_activation(p, self.hidden_act, self.activations)
        p.raise_if_any()
        check_heads(p, self.hidden_size, self.num_heads, "num_heads")
        p.raise_if_any()

    @property
    def patch_dim(self) -> int:
        """Values per pixel_values row: in_channels · patch² (patch_embed.proj's input)."""
        return self.in_channels * self.patch_size ** 2

    @property
    def merge_unit(self) -> int:
        return self.spatial_merge_size ** 2

    @property
    def merged_width(self) -> int:
        """`spatial_dim`: width · spatial_merge_size², the resampler's width."""
        return self.hidden_size * self.merge_unit

    @property
    def temporal_width(self) -> int:
        """`temporal_dim`: the spatial width · temporal_merge_size, temporal_linear.fc1's input."""
        return self.merged_width * self.temporal_merge_size

    def linears(self) -> tuple[TowerLinear, ...]:
        """Every nn.Linear (peft's "all-linear" wraps each): the blocks' (`vision_tower.blocks.N.attn.qkv`,
        `attn.proj`, `mlp.fc1`, `mlp.fc2`, all with bias), the patch embedding (`vision_tower.patch_embed.proj`, no
        bias, part "embed") and the resampler's (`resampler_model.spatial_linear.fc1/fc2`,
        `temporal_linear.fc1/fc2`, `mlp`, with biases)."""
        h, i, d, m = self.hidden_size, self.intermediate_size, self.depth, self.merged_width
        return (TowerLinear(name="attn.qkv", in_features=h, out_features=3 * h, count=d, part="tower"),
                TowerLinear(name="attn.proj", in_features=h, out_features=h, count=d, part="tower"),
                TowerLinear(name="mlp.fc1", in_features=h, out_features=i, count=d, part="tower"),
                TowerLinear(name="mlp.fc2", in_features=i, out_features=h, count=d, part="tower"),
                TowerLinear(name="patch_embed.proj", in_features=self.patch_dim, out_features=h, count=1,
                            part="embed", bias=False),
                TowerLinear(name="spatial_linear.fc1", in_features=m, out_features=m, count=1, part="merger"),
                TowerLinear(name="spatial_linear.fc2", in_features=m, out_features=m, count=1, part="merger"),
                TowerLinear(name="temporal_linear.fc1", in_features=self.temporal_width, out_features=m, count=1,
                            part="merger"),
                TowerLinear(name="temporal_linear.fc2", in_features=m, out_features=m, count=1, part="merger"),
                TowerLinear(name="resampler_model.mlp", in_features=m, out_features=self.out_hidden_size, count=1,
                            part="merger"))

    @property
    def block_params(self) -> int:
        """One block: its four linears and two LayerNorms (weight and bias)."""
        linear = sum(x.params for x in self.linears() if x.part == "tower")
        return linear // self.depth + 4 * self.hidden_size

    @property
    def embed_params(self) -> int:
        """patch_embed.proj (no bias)."""
        return self.patch_dim * self.hidden_size

    @property
    def tower_params(self) -> int:
        """The vision tower: patch embedding, blocks, `ln` (weight and bias)."""
        return self.embed_params + self.depth * self.block_params + 2 * self.hidden_size

    @property
    def merger_params(self) -> int:
        """The resampler: its five linears, the two MLPs' LayerNorms over 4·width and after_norm's weight."""
        linear = sum(x.params for x in self.linears() if x.part == "merger")
        return linear + 2 * 2 * self.merged_width + self.out_hidden_size

    @property
    def num_params(self) -> int:
        return self.tower_params + self.merger_params


def ernie45vl_tower_from_config(cfg: dict[str, Any], name: str) -> Ernie45VlTowerSpec:
    """The Ernie45VlTowerSpec of an ernie4_5_vl_moe config.json dict; keys it omits take the config classes'
    defaults (Ernie4_5_VLMoeVisionConfig's attribute_map: num_attention_heads → num_heads, num_hidden_layers →
    depth)."""
    raw = vision_values(cfg, name, {})
    aliases = {"num_attention_heads": "num_heads", "num_hidden_layers": "depth"}
    vc = {**ERNIE45VL_VISION_DEFAULTS, **{aliases.get(k, k): v for k, v in raw.items()}}
    if vc["spatial_merge_size"] != 2 or vc["temporal_merge_size"] != 2:
        raise SpecError(f"model {name}: hpcmem models ernie4_5_vl_moe at spatial_merge_size 2 and temporal_merge_size "
                        f"2 (the config class's defaults; `_temporal_slicing` is written for 2), got "
                        f"{vc['spatial_merge_size']!r} and {vc['temporal_merge_size']!r}")
    if not isinstance(vc["patch_size"], int):
        raise SpecError(f"model {name}: vision_config.patch_size must be one integer (square patches), got "
                        f"{vc['patch_size']!r}")
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {}
    tc = {**ERNIE45VL_TEXT_ROUTING, **text}
    kinds = tc.get("mlp_layer_types") or ["dense"] + ["sparse"] * (int(tc["num_hidden_layers"]) - 1)
    widths = tc["moe_intermediate_size"]
    if not (isinstance(widths, (list, tuple)) and len(widths) == 2):
        raise SpecError(f"model {name}: text_config.moe_intermediate_size must be [text experts' width, vision "
                        f"experts' width] (Ernie4_5_VLMoeMoeBlock), got {widths!r}")
    if not isinstance(kinds, (list, tuple)) or any(k not in ("dense", "sparse") for k in kinds):
        raise SpecError(f"model {name}: text_config.mlp_layer_types must list \"dense\" or \"sparse\" per layer, got "
                        f"{kinds!r}")
    return Ernie45VlTowerSpec(
        model_type="ernie4_5_vl_moe", depth=vc["depth"], hidden_size=vc["hidden_size"],
        intermediate_size=vc["intermediate_size"], num_heads=vc["num_heads"], in_channels=vc["in_channels"],
        patch_size=vc["patch_size"], out_hidden_size=text_width(cfg, ERNIE45VL_TEXT_HIDDEN),
        hidden_act=str(vc["hidden_act"]), spatial_merge_size=vc["spatial_merge_size"],
        temporal_merge_size=vc["temporal_merge_size"], sparse_layers=sum(k == "sparse" for k in kinds),
        moe_k=tc["moe_k"], text_expert_width=widths[0], vision_expert_width=widths[1],
        num_experts=tc["moe_num_experts"], router_aux_loss_coef=float(tc["router_aux_loss_coef"]))


def ernie45vl_text_only_problems(use_peft: bool) -> list[str]:
    """Full fine-tuning without images: no token reaches the vision experts (modeling_ernie4_5_vl_moe.py
    `Ernie4_5_VLMoeMoeBlock.forward` runs text_moe alone without moe_mm_token_type_ids), so they get no gradient and
    AdamW makes no state for them (torch/optim/adamw.py skips parameters whose grad is None), while the learned text
    part counts every decoder parameter as trained (traced on the cut: 14.8 % over). LoRA leaves the experts frozen
    either way."""
    if use_peft:
        return []
    return ["images_per_example 0 on ernie4_5_vl_moe with full fine-tuning: without images its vision experts get no "
            "gradient and no optimizer state, which the learned text part counts as trained; give images or use LoRA"]

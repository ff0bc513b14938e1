"""HunYuanVLTowerSpec: HunYuanVL's (model_type "hunyuan_vl", HunyuanOCR) native-resolution tower and its convolution
patch merger (transformers 5.24 models/hunyuan_vl/modeling_hunyuan_vl.py, configuration_hunyuan_vl.py).

- The config: `HunYuanVLConfig.sub_configs_defaults` builds an omitted `vision_config` as `HunYuanVLVisionConfig` (width
  1152, MLP 4304, 27 layers, 16 heads, num_channels 3, patch_size 16, exact gelu, max_image_size 2048,
  interpolate_mode bilinear, spatial_merge_size 2) and the text config as `HunYuanVLTextConfig` (learned,
  hpcmem.models.vlm_learned); `__post_init__` sets vision_config.text_hidden_size to text_config.hidden_size (the
  merger's output width), and tie_word_embeddings is True.
- The tower (`HunYuanVLVisionTransformer`): `HunYuanVLVisionPatchEmbed` (`patch_embedding` an nn.Conv2d(3 → width,
  kernel = stride = 16, with bias) over the processor's flattened patches, plus `position_embedding`, an nn.Embedding
  of (max_image_size / patch)² + 1 rows whose last (max_image_size / patch)² form a square grid resized bilinearly per
  image to its own patch grid, `interpolate_pos_encoding`), `num_hidden_layers` `HunYuanVLVisionBlock`s (SigLIP's
  shape: layer_norm1 → q/k/v_proj → attention per image on the cu_seqlens splits, concatenated → o_proj → residual,
  layer_norm2 → mlp fc1 → gelu → fc2 → residual, every linear with a bias), no post-layernorm.
- The merger (`HunYuanVLVisionPatchMerger`, one call per image): `before_rms` (an RMSNorm over the width), the rows
  laid out as the image's [width, grid_h, grid_w] map, `proj_conv` (nn.Conv2d(width → 2 · width, kernel = stride =
  spatial_merge_size)) → gelu → `proj_out` (nn.Conv2d(2 · width → 4 · width, kernel 1)), `image_newline` (a 4 · width
  vector) appended as one more column, `mlp` (nn.Linear(4 · width → text width)), `image_begin` / `image_end` rows
  around them, `after_rms` (an RMSNorm over the text width); `image_sep` is loaded and never read. One image makes
  grid_h / 2 · (grid_w / 2 + 1) + 2 rows, the image tokens.
- The processor (`HunYuanVLImageProcessorPil`, its torchvision twin the same): Qwen2-VL's `smart_resize` (factor
  patch · merge = 32, size {shortest_edge 512², longest_edge 2048²}: hpcmem.job.images `smart_resize`), one frame
  (temporal_patch_size 1); `HunYuanVLProcessor.replace_image_token` writes patch_h · (patch_w + 1) + 2 image tokens
  (`cat_extra_token` True), patch_h, patch_w the merged grid.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from hpcmem.errors import Problems, SpecError
from hpcmem.models.siglip import SIGLIP_ACTIVATIONS
from hpcmem.models.tower_base import (TowerBase, TowerLinear, check_activation, check_counts, check_heads,
                                      encoder_layer_linears, text_width, vision_values)

# configuration_hunyuan_vl.py `HunYuanVLVisionConfig`'s field defaults hpcmem reads
HUNYUAN_VL_VISION_DEFAULTS: dict[str, Any] = {
    "hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27, "num_attention_heads": 16,
    "num_channels": 3, "patch_size": 16, "hidden_act": "gelu", "max_image_size": 2048, "spatial_merge_size": 2,
    "interpolate_mode": "bilinear"}
HUNYUAN_VL_TEXT_HIDDEN = 4096          # `HunYuanVLTextConfig.hidden_size`: the text width of an omitted text_config
# `HunYuanVLImageProcessorPil.size`: (shortest_edge, longest_edge) pixels
HUNYUAN_VL_PIXELS = (512 * 512, 2048 * 2048)
EXTRA_TOKENS = 2                       # image_begin and image_end (`HunYuanVLProcessor.cat_extra_token` True)


@dataclass(frozen=True, kw_only=True)
class HunYuanVLTowerSpec(TowerBase):
    """A SigLIP-shaped tower run over each image's own patch grid (Qwen2-VL's smart_resize, hpcmem.job.images), its
    rows merged spatial_merge_size² at a time by two convolutions into the merger."""

    spatial_merge_size: int
    position_side: int          # max_image_size / patch_size: the learned position grid's side
    default_pixels: tuple[int, int] = HUNYUAN_VL_PIXELS
    norm: str = "layer"         # torch LayerNorms (hpcmem.estimate.vision `block_saved`)
    mlp: str = "fc"             # HunYuanVLVisionMLP: fc2(act(fc1 x))
    family: str = "hunyuan_vl"
    image_size: int = 0         # no fixed resize (hpcmem.job.images): the processor's smart_resize
    temporal_patch_size: int = 1
    fixed_resolution: bool = False
    hooked_input: bool = False  # HunYuanVLVisionTransformer names no input embeddings (get_input_embeddings raises)
    deepstack_visual_indexes: tuple[int, ...] = ()
    merger_linear: bool = True  # the merger's `mlp` Linear and `after_rms` after the convolutions (HY-V4-VL's has none)
    extra_tokens: int = EXTRA_TOKENS    # image rows beyond the merged grid's: image_begin, image_end
    activations: ClassVar[tuple[str, ...]] = SIGLIP_ACTIVATIONS

    def __post_init__(self) -> None:
        p = Problems()
        check_counts(p, self, ("depth", "hidden_size", "intermediate_size", "num_heads", "in_channels", "patch_size",
                               "spatial_merge_size", "position_side", "out_hidden_size"))
        check_activation(p, self.hidden_act, self.activations)
        p.raise_if_any()
        check_heads(p, self.hidden_size, self.num_heads, "num_attention_heads")
        p.raise_if_any()

    @property
    def merge_unit(self) -> int:
        return self.spatial_merge_size ** 2

    @property
    def conv_width(self) -> int:
        """`proj_conv`'s output channels: 2 · width."""
        return 2 * self.hidden_size

    @property
    def merged_width(self) -> int:
        """`proj_out`'s output channels and `mlp`'s input: 4 · width."""
        return 4 * self.hidden_size

    def linears(self) -> tuple[TowerLinear, ...]:
        """Every nn.Linear (peft's "all-linear" wraps each; the three Conv2d are not): the blocks' (`vision_tower.
        layers.N.self_attn.q/k/v/o_proj`, `mlp.fc1`, `mlp.fc2`, all with bias) and the merger's `mlp`
        (`vision_tower.patch_merger.mlp`)."""
        h, i, d = self.hidden_size, self.intermediate_size, self.depth
        return (*encoder_layer_linears(h, i, d, out_proj="o_proj"),
                TowerLinear(name="mlp", in_features=self.merged_width, out_features=self.out_hidden_size, count=1,
                            part="merger"))

    @property
    def block_params(self) -> int:
        linear = sum(x.params for x in self.linears() if x.part == "tower")
        return linear // self.depth + 4 * self.hidden_size

    @property
    def merger_params(self) -> int:
        """The merger: before_rms (width), proj_conv (2·width · width · merge² + 2·width), proj_out (4·width · 2·width
        + 4·width), mlp, image_newline (4·width), image_begin / image_end / image_sep and after_rms (the text width
        each)."""
        h, m, t, k = self.hidden_size, self.merged_width, self.out_hidden_size, self.spatial_merge_size
        convs = self.conv_width * h * k * k + self.conv_width + m * self.conv_width + m
        return h + convs + sum(x.params for x in self.linears() if x.part == "merger") + m + 4 * t

    @property
    def embed_params(self) -> int:
        """patch_embedding (weight and bias) and the position table (position_side² + 1 rows)."""
        h = self.hidden_size
        return self.patch_dim * h + h + (self.position_side ** 2 + 1) * h

    @property
    def tower_params(self) -> int:
        """HunYuanVLVisionTransformer without its patch_merger: the embeddings and the blocks."""
        return self.embed_params + self.depth * self.block_params

    @property
    def num_params(self) -> int:
        return self.tower_params + self.merger_params

    def image_tokens(self, grid_h: int, grid_w: int) -> int:
        """`HunYuanVLProcessor.replace_image_token`: patch_h · (patch_w + 1) + 2 of an image of grid_h × grid_w
        patches (the merged grid, a newline column, begin and end)."""
        ph, pw = grid_h // self.spatial_merge_size, grid_w // self.spatial_merge_size
        return ph * (pw + 1) + self.extra_tokens


def hunyuan_vl_tower_from_config(cfg: dict[str, Any], name: str) -> HunYuanVLTowerSpec:
    """The HunYuanVLTowerSpec of a hunyuan_vl config.json dict; keys it omits take the config classes' defaults."""
    vc = vision_values(cfg, name, HUNYUAN_VL_VISION_DEFAULTS)
    if vc["spatial_merge_size"] != 2:
        raise SpecError(f"model {name}: hpcmem models hunyuan_vl at spatial_merge_size 2 (HunYuanVLVisionConfig's "
                        f"default, the image processor's merge_size), got {vc['spatial_merge_size']!r}")
    if vc["interpolate_mode"] != "bilinear":
        raise SpecError(f"model {name}: vision_config.interpolate_mode {vc['interpolate_mode']!r}: hpcmem models "
                        "hunyuan_vl's position grid resized bilinearly only (HunYuanVLVisionConfig's default)")
    size, patch = vc["max_image_size"], vc["patch_size"]
    if not isinstance(size, int) or not isinstance(patch, int) or patch < 1 or size < patch or size % patch:
        raise SpecError(f"model {name}: vision_config.max_image_size {size!r} must be a whole multiple of patch_size "
                        f"{patch!r} (the position grid's side, HunYuanVLVisionPatchEmbed.position_edge)")
    return HunYuanVLTowerSpec(
        model_type="hunyuan_vl", depth=vc["num_hidden_layers"], hidden_size=vc["hidden_size"],
        intermediate_size=vc["intermediate_size"], num_heads=vc["num_attention_heads"],
        in_channels=vc["num_channels"], patch_size=patch, position_side=size // patch,
        out_hidden_size=text_width(cfg, HUNYUAN_VL_TEXT_HIDDEN), hidden_act=str(vc["hidden_act"]),
        spatial_merge_size=vc["spatial_merge_size"])

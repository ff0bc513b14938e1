"""HYV4VLTowerSpec: HY-V4-VL's (model_type "hy_v4_vl") tower and patch merger (transformers 5.24
models/hy_v4_vl/modular_hy_v4_vl.py over models/hunyuan_vl): HunYuanVL's tower (hpcmem.models.hunyuan_vl) with its own
widths and a merger without the Linear, the begin/end rows and the second norm.

- The config: `HYV4VLConfig.sub_configs_defaults` builds an omitted `vision_config` as `HYV4VLVisionConfig`
  (HunYuanVLVisionConfig's fields, width 1536, MLP 6144, 40 layers, 16 heads, 16 px patches, exact gelu, max_image_size
  2048, out_hidden_size 6144; no text_hidden_size: nothing ties it to the text width) and the text config as
  `HYV4VLTextConfig` (HY-V4's MLA / DSA / hyper-connection MoE decoder under 3-axis M-RoPE: learned,
  hpcmem.models.vlm_learned); tie_word_embeddings False.
- The tower (`HYV4VLVisionModel(HunYuanVLVisionTransformer)`): HunYuanVL's patch embedding (the position grid resized
  with `scale_factor` (size + 0.1) / 128, the same output size), blocks (`HYV4VLVisionAttention`: sinks None) and
  per-image merger call.
- The merger (`HYV4VLVisionPatchMerger`): `before_rms`, the rows viewed [frames, width, grid_h, grid_w] (a permuted
  view, no copy), `proj_conv` (Conv2d(width → width · merge², kernel = stride = merge)) → gelu → `proj_out`
  (Conv2d(width · merge² → out_hidden_size, kernel 1)), `image_newline` appended as one more column, the rows packed
  back into one sequence: grid_h / 2 · (grid_w / 2 + 1) rows per image, no begin or end.
- The processor (`HYV4VLImageProcessorPil(HunYuanVLImageProcessorPil)`: Qwen2-VL's smart_resize at 512² … 2048²
  pixels); `HYV4VLProcessor.replace_image_token` writes `_num_frame_tokens` = patch_h · (patch_w + 1) "<|image_pad|>"
  tokens (the tokenizer's image_token where it names one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpcmem.errors import SpecError
from hpcmem.models.hunyuan_vl import HUNYUAN_VL_PIXELS, HunYuanVLTowerSpec
from hpcmem.models.tower_base import TowerLinear, encoder_layer_linears, vision_values

# modular_hy_v4_vl.py `HYV4VLVisionConfig`'s field defaults hpcmem reads
HY_V4_VL_VISION_DEFAULTS: dict[str, Any] = {
    "hidden_size": 1536, "intermediate_size": 6144, "num_hidden_layers": 40, "num_attention_heads": 16,
    "num_channels": 3, "patch_size": 16, "hidden_act": "gelu", "max_image_size": 2048, "spatial_merge_size": 2,
    "interpolate_mode": "bilinear", "out_hidden_size": 6144}


@dataclass(frozen=True, kw_only=True)
class HYV4VLTowerSpec(HunYuanVLTowerSpec):
    """HunYuanVL's tower; its merger two convolutions and a newline column, no Linear."""

    family: str = "hy_v4_vl"
    default_pixels: tuple[int, int] = HUNYUAN_VL_PIXELS
    merger_linear: bool = False
    extra_tokens: int = 0

    @property
    def conv_width(self) -> int:
        """`proj_conv`'s output channels: width · spatial_merge_size²."""
        return self.hidden_size * self.merge_unit

    @property
    def merged_width(self) -> int:
        """`proj_out`'s output channels: out_hidden_size, the image rows' width."""
        return self.out_hidden_size

    def linears(self) -> tuple[TowerLinear, ...]:
        """Every nn.Linear (peft's "all-linear" wraps each): the blocks' (`vision_tower.layers.N.self_attn.
        q/k/v/o_proj`, `mlp.fc1`, `mlp.fc2`, all with bias); the merger has none (two Conv2d)."""
        return encoder_layer_linears(self.hidden_size, self.intermediate_size, self.depth, out_proj="o_proj")

    @property
    def merger_params(self) -> int:
        """The merger: before_rms (width), proj_conv (width·merge² · width · merge² + width·merge²), proj_out
        (out · width·merge² + out), image_newline (out)."""
        h, c, o, k = self.hidden_size, self.conv_width, self.out_hidden_size, self.spatial_merge_size
        return h + c * h * k * k + c + o * c + o + o


def hy_v4_vl_tower_from_config(cfg: dict[str, Any], name: str) -> HYV4VLTowerSpec:
    """The HYV4VLTowerSpec of a hy_v4_vl config.json dict; keys it omits take the config classes' defaults."""
    vc = vision_values(cfg, name, HY_V4_VL_VISION_DEFAULTS)
    if vc["spatial_merge_size"] != 2:
        raise SpecError(f"model {name}: hpcmem models hy_v4_vl at spatial_merge_size 2 (HYV4VLVisionConfig's "
                        f"default, the image processor's merge_size), got {vc['spatial_merge_size']!r}")
    if vc["interpolate_mode"] != "bilinear":
        raise SpecError(f"model {name}: vision_config.interpolate_mode {vc['interpolate_mode']!r}: hpcmem models "
                        "hy_v4_vl's position grid resized bilinearly only (HYV4VLVisionConfig's default)")
    size, patch = vc["max_image_size"], vc["patch_size"]
    if not isinstance(size, int) or not isinstance(patch, int) or patch < 1 or size < patch or size % patch:
        raise SpecError(f"model {name}: vision_config.max_image_size {size!r} must be a whole multiple of patch_size "
                        f"{patch!r} (the position grid's side, HunYuanVLVisionPatchEmbed.position_edge)")
    return HYV4VLTowerSpec(
        model_type="hy_v4_vl", depth=vc["num_hidden_layers"], hidden_size=vc["hidden_size"],
        intermediate_size=vc["intermediate_size"], num_heads=vc["num_attention_heads"],
        in_channels=vc["num_channels"], patch_size=patch, position_side=size // patch,
        out_hidden_size=vc["out_hidden_size"], hidden_act=str(vc["hidden_act"]),
        spatial_merge_size=vc["spatial_merge_size"])

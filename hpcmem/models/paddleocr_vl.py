"""PaddleOcrTowerSpec: PaddleOCR-VL's (model_type "paddleocr_vl") vision tower and projector with images, as its
config.json's `vision_config` and outer keys describe them, their linear layers and parameter count (transformers
5.24 models/paddleocr_vl).

- The config (configuration_paddleocr_vl.py): `PaddleOCRVisionConfig(SiglipVisionConfig)`'s class defaults fill what
  `vision_config` omits (`PADDLEOCR_VISION_DEFAULTS`, the PaddleOCR-VL 0.9B tower); `PaddleOCRVLConfig(Qwen2VLConfig)`
  builds an omitted `text_config` as `PaddleOCRTextConfig(Ernie4_5Config)`'s defaults (`PADDLEOCR_TEXT_DEFAULTS`,
  ERNIE-4.5-0.3B's widths) and ties the head by default (tie_word_embeddings True).
- The tower (modeling_paddleocr_vl.py `PaddleOCRVisionTransformer`): a Conv2d patch embedding with bias over each
  pixel_values row viewed as [channels, patch, patch], plus SigLIP's learned position table ((image_size / patch)²
  rows) resampled to each image's grid (`PaddleOCRVisionEmbeddings.forward`: four table rows per patch, bilinear
  weights); `num_hidden_layers` VideoLLaMA3 encoder layers (LayerNorm → q/k/v/out_proj with biases, 2D rotary
  attention per image over cu_seqlens chunks → LayerNorm → fc1 → `hidden_act` → fc2 with biases) and
  `post_layernorm`.
- The projector (`PaddleOCRProjector`): per image a LayerNorm (`pre_norm`, the tower width, weight and bias), the
  2 × 2 neighbours (`spatial_merge_size`) concatenated into one row, `linear_1` (4·width → 4·width) → GELU →
  `linear_2` (4·width → text width), biases.
- The image processor (image_processing_pil_paddleocr_vl.py `PaddleOCRVLImageProcessorPil`): Qwen2-VL's smart_resize
  at factor patch_size · merge_size (merge_size 2) between 384² and 1536² pixels (its class `size`), temporal_patch_size
  1: (height / patch) · (width / patch) patches and a quarter of that in image tokens per image
  (processing_paddleocr_vl.py `replace_image_token`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpcmem.errors import Problems, SpecError
from hpcmem.models.tower_base import (TowerLinear, check_counts, encoder_layer_linears, grid_patches, text_width,
                                      vision_values)
from hpcmem.models.video_llama_3 import VideoLlama3TowerSpec

# configuration_paddleocr_vl.py `PaddleOCRVisionConfig`'s field defaults (with SiglipVisionConfig's it keeps)
PADDLEOCR_VISION_DEFAULTS: dict[str, Any] = {
    "hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27, "num_attention_heads": 16,
    "num_channels": 3, "image_size": 384, "patch_size": 14, "spatial_merge_size": 2,
    "hidden_act": "gelu_pytorch_tanh"}
# `PaddleOCRTextConfig(Ernie4_5Config)`'s field defaults: what a key the text_config omits takes. Its decoder layer is
# Ernie4_5DecoderLayer's with q/k/v/o biases as `use_bias` says and multimodal RoPE (`PaddleOCRAttention`); the text
# part is taken as ernie4_5's (Ernie4_5ForCausalLM builds the same layers with 1-D RoPE)
PADDLEOCR_TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 103424, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 18,
    "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 128, "hidden_act": "silu",
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "use_bias": False}
# PaddleOCRVLImageProcessorPil.size: {"shortest_edge": 384 · 384, "longest_edge": 1536 · 1536}
PADDLEOCR_MIN_PIXELS, PADDLEOCR_MAX_PIXELS = 384 * 384, 1536 * 1536
ERNIE_HIDDEN = PADDLEOCR_TEXT_DEFAULTS["hidden_size"]


@dataclass(frozen=True, kw_only=True)
class PaddleOcrTowerSpec(VideoLlama3TowerSpec):
    """PaddleOCR-VL's SigLIP-NaViT tower (VideoLLaMA3's encoder layers, hpcmem.models.video_llama_3) under its merging
    two-linear projector; `out_hidden_size` is the text width. What differs from VideoLLaMA3's: the position table
    (its side `table_size`), the merge (`spatial_merge_size` 2: the projector's and the image processor's), the
    processor class's pixel bounds (`default_pixels`), no hooked input, and the projector."""

    table_size: int
    spatial_merge_size: int = 2
    default_pixels: tuple[int, int] = (PADDLEOCR_MIN_PIXELS, PADDLEOCR_MAX_PIXELS)
    # `PaddleOCRVisionModel` names no input embeddings of its own: `enable_input_require_grads` hooks the language
    # model's token embeddings only
    hooked_input: bool = False
    family: str = "paddleocr_vl"

    def __post_init__(self) -> None:
        super().__post_init__()
        p = Problems()
        check_counts(p, self, ("table_size",))
        p.raise_if_any()

    @property
    def merged_width(self) -> int:
        """The projector's row after the merge: merge_size² · tower width."""
        return self.merge_unit * self.hidden_size

    @property
    def num_positions(self) -> int:
        """The position table's rows: (image_size / patch_size)²."""
        return grid_patches(self.table_size, self.patch_size)

    def linears(self) -> tuple[TowerLinear, ...]:
        h, i, d, o, m = self.hidden_size, self.intermediate_size, self.depth, self.out_hidden_size, self.merged_width
        return (*encoder_layer_linears(h, i, d),
                TowerLinear(name="linear_1", in_features=m, out_features=m, count=1, part="merger"),
                TowerLinear(name="linear_2", in_features=m, out_features=o, count=1, part="merger"))

    @property
    def embed_params(self) -> int:
        """The Conv2d patch embedding (weight and bias) and the position table."""
        return self.patch_dim * self.hidden_size + self.hidden_size + self.num_positions * self.hidden_size

    @property
    def merger_params(self) -> int:
        """pre_norm (weight and bias) and the two linears."""
        return 2 * self.hidden_size + sum(x.params for x in self.linears() if x.part == "merger")


def paddleocr_tower_from_config(cfg: dict[str, Any], name: str) -> PaddleOcrTowerSpec:
    """The PaddleOcrTowerSpec of a paddleocr_vl config.json dict; keys it omits take PaddleOCRVisionConfig's
    defaults."""
    vc = vision_values(cfg, name, PADDLEOCR_VISION_DEFAULTS)
    for key in ("patch_size", "image_size"):
        if isinstance(vc[key], (list, tuple)):
            raise SpecError(f"model {name}: vision_config.{key} {vc[key]!r}: hpcmem models square patches and "
                            "position tables (an integer)")
    return PaddleOcrTowerSpec(model_type="paddleocr_vl", depth=vc["num_hidden_layers"], hidden_size=vc["hidden_size"],
                              intermediate_size=vc["intermediate_size"], num_heads=vc["num_attention_heads"],
                              in_channels=vc["num_channels"], patch_size=vc["patch_size"],
                              table_size=vc["image_size"], spatial_merge_size=vc["spatial_merge_size"],
                              out_hidden_size=text_width(cfg, ERNIE_HIDDEN), hidden_act=str(vc["hidden_act"]))

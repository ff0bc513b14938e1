"""MiniMaxM3VlTowerSpec: MiniMax M3 VL's (model_type "minimax_m3_vl") vision tower and projector with images, as its
config.json's `vision_config` and outer keys describe them, their linear layers and parameter count (transformers
5.24 models/minimax_m3_vl/modular_minimax_m3_vl.py).

- The config (`MiniMaxM3VLConfig`): `sub_configs_defaults` builds an omitted `vision_config` as
  `MiniMaxM3VLVisionConfig`'s class defaults (`MINIMAX_M3_VISION_DEFAULTS`) and an omitted `text_config` as
  `MiniMaxM3VLTextConfig`'s (width 6144: a MoE decoder with a sparse-attention indexer, learned,
  hpcmem.models.vlm_learned); the outer `projector_hidden_size` 6144 and tie_word_embeddings False.
- The tower (`MiniMaxM3VLVisionModel`): `embeddings.proj`, Qwen2.5-VL's Conv3d patch embedding without bias over each
  pixel_values row viewed [channels, temporal_patch_size, patch, patch]; `pre_layrnorm` (a LayerNorm, weight and
  bias); `num_hidden_layers` `MiniMaxM3VLVisionEncoderLayer`s (CLIPEncoderLayer's: layer_norm1 → q/k/v/out_proj with
  biases, partial 3-D rotary attention per image over cu_seqlens chunks (PaddleOCRVisionAttention's) → layer_norm2 →
  fc1 → `hidden_act` → fc2 with biases); no post-layernorm. The rotary table's inv_freq is a buffer.
- The projector (`MiniMaxM3VLMultiModalProjector`): per patch `linear_1` (tower width → projector_hidden_size) → GELU
  → `linear_2` (→ text width), the merge_size² neighbours' rows then concatenated ([N / 4, 4 · text width]),
  `merge_linear_1` (→ projector_hidden_size) → GELU → `merge_linear_2` (→ text width); all with biases.
- The image processor (`MiniMaxM3VLImageProcessor(Qwen2VLImageProcessor)`): Qwen2-VL's smart_resize at factor
  patch · merge_size (28), temporal_patch_size 2 (a still image as two frames: grid_t 1), its class `size` 4 · 28² …
  451,584 pixels; `MiniMaxM3VLProcessor.replace_image_token` writes grid_t · grid_h · grid_w / merge_size² image tokens
  between "]<]start of image[>[" and "]<]end of image[>[".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpcmem.errors import SpecError
from hpcmem.models.tower_base import TowerLinear, encoder_layer_linears, text_width, vision_values
from hpcmem.models.video_llama_3 import VideoLlama3TowerSpec

# configuration_minimax_m3_vl.py `MiniMaxM3VLVisionConfig`'s field defaults
MINIMAX_M3_VISION_DEFAULTS: dict[str, Any] = {
    "hidden_size": 1280, "intermediate_size": 5120, "num_hidden_layers": 32, "num_attention_heads": 16,
    "num_channels": 3, "image_size": 2016, "patch_size": 14, "temporal_patch_size": 2, "spatial_merge_size": 2,
    "hidden_act": "gelu"}
MINIMAX_M3_TEXT_HIDDEN = 6144           # `MiniMaxM3VLTextConfig.hidden_size`: an omitted text_config's width
MINIMAX_M3_PROJECTOR_HIDDEN = 6144      # `MiniMaxM3VLConfig.projector_hidden_size`
# `MiniMaxM3VLImageProcessor.size`: {"shortest_edge": 4 · 28 · 28, "longest_edge": 451584}
MINIMAX_M3_PIXELS = (4 * 28 * 28, 451584)


@dataclass(frozen=True, kw_only=True)
class MiniMaxM3VlTowerSpec(VideoLlama3TowerSpec):
    """MiniMax M3 VL's CLIP-layer tower (VideoLLaMA3's encoder layers, hpcmem.models.video_llama_3, with the Qwen
    Conv3d patch embedding and a pre-layernorm) under its two-stage merging projector; `out_hidden_size` is the text
    width, `projector_hidden` the projector's inner width. `image_size` stays 0 (the processor's dynamic resolution;
    the config's image_size is read by nothing in the model)."""

    projector_hidden: int
    spatial_merge_size: int = 2
    temporal_patch_size: int = 2
    default_pixels: tuple[int, int] = MINIMAX_M3_PIXELS
    # `MiniMaxM3VLVisionModel` names no input embeddings (PreTrainedModel.get_input_embeddings raises
    # NotImplementedError, which `enable_input_require_grads` skips): only the token embeddings are hooked
    hooked_input: bool = False
    family: str = "minimax_m3_vl"

    @property
    def patch_dim(self) -> int:
        """Values per pixel_values row: channels · temporal_patch_size · patch² (the Conv3d's input)."""
        return self.in_channels * self.temporal_patch_size * self.patch_size ** 2

    @property
    def rotary_dim(self) -> int:
        """The channels the tower's rotary table covers (`MiniMaxM3VLVisionRotaryEmbedding`: three axes of
        2 · ((head_dim // 3) // 2) / 2 frequencies, `recomposition_frequencies` doubling them): 3 · 2 · ((head_dim //
        3) // 2)."""
        return 3 * 2 * ((self.hidden_size // self.num_heads // 3) // 2)

    def linears(self) -> tuple[TowerLinear, ...]:
        h, i, d, o, p = self.hidden_size, self.intermediate_size, self.depth, self.out_hidden_size, \
            self.projector_hidden
        return (*encoder_layer_linears(h, i, d),
                TowerLinear(name="linear_1", in_features=h, out_features=p, count=1, part="merger"),
                TowerLinear(name="linear_2", in_features=p, out_features=o, count=1, part="merger"),
                TowerLinear(name="merge_linear_1", in_features=self.merge_unit * o, out_features=p, count=1,
                            part="merger"),
                TowerLinear(name="merge_linear_2", in_features=p, out_features=o, count=1, part="merger"))

    @property
    def embed_params(self) -> int:
        """The Conv3d patch embedding (no bias)."""
        return self.patch_dim * self.hidden_size

    @property
    def tower_params(self) -> int:
        """The patch embedding, pre_layrnorm (weight and bias) and the encoder layers."""
        return self.embed_params + 2 * self.hidden_size + self.depth * self.block_params


def minimax_m3_tower_from_config(cfg: dict[str, Any], name: str) -> MiniMaxM3VlTowerSpec:
    """The MiniMaxM3VlTowerSpec of a minimax_m3_vl config.json dict; keys it omits take the config classes'
    defaults."""
    vc = vision_values(cfg, name, MINIMAX_M3_VISION_DEFAULTS)
    if isinstance(vc["patch_size"], (list, tuple)):
        raise SpecError(f"model {name}: vision_config.patch_size {vc['patch_size']!r}: hpcmem models square patches "
                        "(an integer)")
    return MiniMaxM3VlTowerSpec(model_type="minimax_m3_vl", depth=vc["num_hidden_layers"],
                                hidden_size=vc["hidden_size"], intermediate_size=vc["intermediate_size"],
                                num_heads=vc["num_attention_heads"], in_channels=vc["num_channels"],
                                patch_size=vc["patch_size"], temporal_patch_size=vc["temporal_patch_size"],
                                spatial_merge_size=vc["spatial_merge_size"],
                                out_hidden_size=text_width(cfg, MINIMAX_M3_TEXT_HIDDEN),
                                projector_hidden=cfg.get("projector_hidden_size", MINIMAX_M3_PROJECTOR_HIDDEN),
                                hidden_act=str(vc["hidden_act"]))

"""LightOnOcrTowerSpec: LightOnOCR's vision tower (Pixtral) and projector, and what differs from Mistral 3's
(hpcmem.models.pixtral, whose tower, projector and resize it reuses).

transformers 5.24 models/lighton_ocr/modular_lighton_ocr.py:
- `LightOnOcrConfig`: vision_config a `pixtral` (sub_configs_defaults init_kwargs when omitted: width 1024, MLP 4096,
  24 layers, 16 heads, 14 px patches, image_size 1540, silu), text_config a `qwen3` (1024 wide, 28 layers, 16 heads,
  8 KV heads, head_dim 128, MLP 3072, vocabulary 151,936), spatial_merge_size 2, image_token_id 151655,
  tie_word_embeddings True. No vision_feature_layer, projector_hidden_act or multimodal_projector_bias keys.
- `LightOnOcrMultiModalProjector(Mistral3MultiModalProjector)`: Mistral 3's norm and patch merger, `act` nn.GELU(),
  linear_1 (width → text width) and linear_2 (text width → text width) without bias, whatever the config says.
- `LightOnOcrModel`: the tower is `vision_encoder`, the projector `vision_projection`; `get_image_features` reads the
  tower's `last_hidden_state` (no output_hidden_states: the tower records no per-layer hidden states).
- `LightOnOcrProcessor`: it hands the image processor no patch_size, so `PixtralImageProcessor` rounds each side up to
  its own patch_size (hpcmem takes it to be vision_config.patch_size, as it takes longest_edge to be image_size);
  `replace_image_token` writes (height // (patch · merge)) · (width // (patch · merge)) image tokens and no break or
  end tokens — the rows the patch merger's unfold makes, an odd last row or column of patches dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpcmem.models.pixtral import PixtralTowerSpec, pixtral_vision_values
from hpcmem.models.tower_base import text_width

# LightOnOcrConfig's sub_configs_defaults init_kwargs for an omitted vision_config
LIGHTON_VISION_DEFAULTS: dict[str, Any] = {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24,
                                           "num_attention_heads": 16, "num_channels": 3, "image_size": 1540,
                                           "patch_size": 14, "hidden_act": "silu", "head_dim": 64}
# LightOnOcrConfig's sub_configs_defaults init_kwargs for an omitted text_config (the decoder's shape)
LIGHTON_TEXT_DEFAULTS: dict[str, Any] = {"model_type": "qwen3", "head_dim": 128, "hidden_act": "silu",
                                         "hidden_size": 1024, "intermediate_size": 3072,
                                         "max_position_embeddings": 40960, "num_attention_heads": 16,
                                         "num_hidden_layers": 28, "num_key_value_heads": 8, "rms_norm_eps": 1e-6,
                                         "rope_theta": 1000000, "sliding_window": None, "vocab_size": 151936}
LIGHTON_DEFAULTS: dict[str, Any] = {"spatial_merge_size": 2}


@dataclass(frozen=True, kw_only=True)
class LightOnOcrTowerSpec(PixtralTowerSpec):
    """Mistral 3's Pixtral tower and projector as LightOnOCR builds them: the image processor's own patch-size resize
    step, image tokens the merger's rows alone, no recorded hidden states."""

    records_hidden_states: bool = False

    @property
    def step(self) -> int:
        """The image processor's resize step: its patch_size (LightOnOcrProcessor passes it none)."""
        return self.patch_size

    def image_tokens(self, height: int, width: int) -> int:
        """LightOnOcrProcessor `replace_image_token`: one image token per merged patch block, no breaks."""
        return self.merged_tokens(height, width)


def lighton_tower_from_config(cfg: dict[str, Any], name: str) -> LightOnOcrTowerSpec:
    """The LightOnOcrTowerSpec of a lighton_ocr config.json dict; keys it omits take the config classes' defaults."""
    vc = pixtral_vision_values(cfg, name, "lighton_ocr", LIGHTON_VISION_DEFAULTS)
    merge = cfg.get("spatial_merge_size", LIGHTON_DEFAULTS["spatial_merge_size"])
    return LightOnOcrTowerSpec(
        model_type="lighton_ocr", depth=vc["num_hidden_layers"], hidden_size=vc["hidden_size"],
        intermediate_size=vc["intermediate_size"], num_heads=vc["num_attention_heads"], in_channels=vc["num_channels"],
        image_size=vc["image_size"], patch_size=vc["patch_size"],
        out_hidden_size=text_width(cfg, LIGHTON_TEXT_DEFAULTS["hidden_size"]), hidden_act=str(vc["hidden_act"]),
        spatial_merge_size=merge, projector_act="gelu", projector_bias=False)

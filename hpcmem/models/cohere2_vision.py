"""Cohere2VisionTowerSpec: Cohere2 Vision's (model_type "cohere2_vision") SigLIP tower and pixel-shuffle SwiGLU
projector, Aya Vision's (hpcmem.models.aya_vision) with three differences (transformers 5.24).

- The classes (models/cohere2_vision/modular_cohere2_vision.py): `Cohere2VisionModel(AyaVisionModel)` and
  `Cohere2VisionForConditionalGeneration(AyaVisionForConditionalGeneration)` build the same SiglipVisionModel tower
  and `AutoModel.from_config` decoder (a Cohere2 by default, learned: hpcmem.models.vlm_learned).
- The reading (`Cohere2VisionModel.get_image_features`): `last_hidden_state`, the output of SiglipVisionModel's
  `post_layernorm`, which is thus on the loss's path (trained), and no hidden states asked for (nothing recorded by
  `capture_outputs`); every patch kept.
- The projector (`Cohere2VisionMultiModalProjector`): pixel_shuffle → linear_1 (4 · width → alignment_intermediate_size,
  bias) → `act(gate) * x` over its chunk(2) → linear_2 (alignment / 2 → text width, bias); no LayerNorm.
- The config (configuration_cohere2_vision.py `Cohere2VisionConfig`): an omitted `vision_config` is a
  `siglip_vision_model` of width 1152, MLP 3072, 512 px, 27 layers, 12 heads (SiglipVisionConfig's 16 px patches);
  downsample_factor 2, alignment_intermediate_size 36864 (not the text width), tie_word_embeddings True; it has no
  vision_feature_layer or vision_feature_select_strategy.
- The tiles (image_processing_cohere2_vision.py `Cohere2VisionImageProcessor`, size 512, crop_to_patches True,
  min_patches 1, max_patches 12): `crop_image_to_patches` takes the columns × rows canvas of
  `get_optimal_tiled_canvas` (`cohere2_canvas`: least upscaling, not GotOcr2's closest aspect ratio) and a thumbnail
  when more than one tile. The processor (processing_cohere2_vision.py `Cohere2VisionProcessor.replace_image_token`)
  writes per image <|START_OF_IMG|>, per tile `patch_size`² image tokens (the image processor's patch_size 16: the
  tokens a side of a 512 px tile, (512 / 16 / 2)) and <|IMG_LINE_BREAK|>, then <|END_OF_IMG|>.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, ClassVar, cast

from hpcmem.models.aya_vision import AyaVisionTowerSpec, aya_vision_tower_from_config

# Cohere2VisionConfig's sub_configs_defaults init_kwargs for an omitted vision_config
COHERE2_VISION_DEFAULTS: dict[str, Any] = {"hidden_size": 1152, "intermediate_size": 3072, "image_size": 512,
                                           "num_hidden_layers": 27, "num_attention_heads": 12}
COHERE2_ALIGNMENT = 36864       # Cohere2VisionConfig.alignment_intermediate_size
COHERE2_OUTER_KEYS = ("downsample_factor",)     # Cohere2VisionConfig's fields Aya Vision's reading reads


@dataclass(frozen=True, kw_only=True)
class Cohere2VisionTowerSpec(AyaVisionTowerSpec):
    """Aya Vision's tower and projector read at last_hidden_state, its projector without a LayerNorm, Cohere2's
    tiles."""

    family: str = "cohere2_vision"
    projector_norm: ClassVar[bool] = False
    reads_last_hidden_state: ClassVar[bool] = True

    def tiles(self, height: int, width: int) -> tuple[int, int, int]:
        """(tiles, columns, rows) of one image (Cohere2VisionImageProcessor._preprocess: with crop_to_patches, the
        `cohere2_canvas` tiles and a thumbnail when more than one; else one tile)."""
        if not self.crop_to_patches:
            return 1, 1, 1
        cols, rows = cohere2_canvas(height, width, self.tile, self.max_patches)
        return cols * rows + (1 if cols * rows > 1 else 0), cols, rows


@lru_cache(maxsize=256)
def cohere2_canvas(height: int, width: int, tile: int, max_patches: int) -> tuple[int, int]:
    """image_processing_cohere2_vision.py `get_optimal_tiled_canvas` (min_image_tiles unread there): (columns, rows)
    among the arrangements of at most max_patches tiles (`get_all_supported_aspect_ratios`, columns-major, stably
    sorted by tile count), each scaled by the least of columns · tile / width and rows · tile / height; when every
    scale is below 1 the largest, else the least scale of at least 1 (the first such on a tie)."""
    grids = sorted(((c, r) for c in range(1, max_patches + 1) for r in range(1, max_patches + 1)
                    if c * r <= max_patches), key=lambda g: g[0] * g[1])
    scales = [min(c * tile / width, r * tile / height) for c, r in grids]
    if all(s < 1 for s in scales):
        return grids[scales.index(max(scales))]
    return grids[scales.index(min(s for s in scales if s >= 1))]


def cohere2_vision_tower_from_config(cfg: dict[str, Any], name: str) -> Cohere2VisionTowerSpec:
    """The Cohere2VisionTowerSpec of a cohere2_vision config.json dict (Aya Vision's reading with Cohere2VisionConfig's
    defaults); the tiles' settings as the config dict names them, else Cohere2VisionImageProcessor's class defaults
    (the same as GotOcr2's with crop_to_patches: hpcmem.models.internvl PROCESSOR_DEFAULTS)."""
    return cast(Cohere2VisionTowerSpec, aya_vision_tower_from_config(
        cfg, name, model_type="cohere2_vision", vision_defaults=COHERE2_VISION_DEFAULTS, outer_keys=COHERE2_OUTER_KEYS,
        alignment=COHERE2_ALIGNMENT, spec=Cohere2VisionTowerSpec))

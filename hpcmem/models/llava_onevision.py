"""LlavaOnevisionTowerSpec: LLaVA-OneVision's vision tower, projector and "anyres_max" image geometry — a SigLIP tower
(hpcmem.models.siglip) under LLaVA-NeXT's projector, anyres tiles and image_newline (hpcmem.models.llava_next), and
the downscaling of a large image's grid.

transformers 5.24 models/llava_onevision/configuration_llava_onevision.py `LlavaOnevisionConfig`: its vision_config a
`siglip_vision_model` (sub_configs_defaults init_kwargs when omitted: width 1152, MLP 4304, 26 layers, 16 heads, 384 px,
14 px patches, vision_use_head false), a qwen2 text_config, vision_feature_layer -1, vision_feature_select_strategy
"full", projector gelu with bias, vision_aspect_ratio "anyres_max_9", and image_grid_pinpoints (default: every
(a·384, b·384) for a, b in 1..6).
modeling_llava_onevision.py `LlavaOnevisionModel`: `vision_tower` (`SiglipVisionModel`: a Conv2d patch embedding with
bias, a position table of (image_size / patch_size)² rows, no class token, no pre-norm, the encoder layers,
post_layernorm on last_hidden_state), `LlavaOnevisionMultiModalProjector` (llava's linear_1 → gelu → linear_2),
`image_newline`. `get_image_features` runs the tower on every tile and reads hidden_states[vision_feature_layer] (-1:
the last layer's output, before post_layernorm, which is therefore off the loss's path).

One image (image_processing_pil_llava_onevision.py `LlavaOnevisionImageProcessorPil._preprocess`): alone in its row
(`batch_num_images` 1) it becomes LLaVA-NeXT's best-pinpoint tiles and the base image (`get_image_patches`); in a
row of several images each is padded to a square and resized to one tile. Its image tokens
(processing_llava_onevision.py `_get_number_of_features`, `_get_unpadded_features`; modeling_llava_onevision.py
`pack_image_features` builds the same rows): the unpadded grid of the tiles' patches, downscaled when it holds more
than 1.1² × max_num_patches tiles' patches (`ratio = sqrt(rows · cols / (max_num_patches · side²))`, rows and cols
`int(x // ratio)`, `nn.functional.interpolate(..., mode="bilinear")`), one newline per remaining row, the base
tile's side² patches; a tile of a multi-image row is side² patches and one newline.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from hpcmem.errors import SpecError
from hpcmem.models.clip_tower import LLAVA_DEFAULTS, feature_layer
from hpcmem.models.llava_next import LlavaNextTowerSpec, pinpoints_from_config
from hpcmem.models.siglip import SIGLIP_ACTIVATIONS, SIGLIP_DEFAULTS, SiglipTowerCounts
from hpcmem.models.tower_base import text_width

# LlavaOnevisionConfig's sub_configs_defaults init_kwargs for an omitted vision_config
ONEVISION_VISION_DEFAULTS: dict[str, Any] = {"hidden_size": 1152, "intermediate_size": 4304, "patch_size": 14,
                                             "image_size": 384, "num_hidden_layers": 26, "num_attention_heads": 16,
                                             "vision_use_head": False}
# LlavaOnevisionConfig's own defaults (those llava shares, and its own)
ONEVISION_DEFAULTS: dict[str, Any] = {**LLAVA_DEFAULTS, "vision_feature_layer": -1,
                                      "vision_feature_select_strategy": "full", "vision_aspect_ratio": "anyres_max_9"}
# LlavaOnevisionConfig.__post_init__'s image_grid_pinpoints when the config names none: (a·384, b·384), a, b in 1..6
DEFAULT_PINPOINTS: tuple[tuple[int, int], ...] = tuple((a * 384, b * 384) for a in range(1, 7) for b in range(1, 7))
QWEN2_HIDDEN = 4096             # Qwen2Config.hidden_size, the text width when text_config names none
DOWNSCALE_ABOVE = 1.1           # `if ratio > 1.1` in pack_image_features and _get_unpadded_features


@dataclass(frozen=True, kw_only=True)
class LlavaOnevisionTowerSpec(SiglipTowerCounts, LlavaNextTowerSpec):
    """A SigLIP tower under llava's projector, anyres tiles whose grid is downscaled past max_num_patches tiles, and
    an image_newline vector of the text width."""

    max_num_patches: int = 9    # vision_aspect_ratio "anyres_max_N"
    activations: ClassVar[tuple[str, ...]] = SIGLIP_ACTIVATIONS
    whole_grid: ClassVar[bool] = False

    def kept_grid(self, height: int, width: int) -> tuple[int, int]:
        """(rows, cols) of the unpadded grid after anyres_max's downscaling (`pack_image_features`)."""
        rows, cols = self.unpadded_grid(height, width)
        side = self.image_size // self.patch_size
        ratio = math.sqrt(rows * cols / (self.max_num_patches * side ** 2))
        if ratio > DOWNSCALE_ABOVE:
            rows, cols = int(rows // ratio), int(cols // ratio)
        return rows, cols

    def anyres_tokens(self, height: int, width: int) -> int:
        """Image tokens of one image alone in its row: the kept grid, a newline per kept row, the base tile."""
        rows, cols = self.kept_grid(height, width)
        return rows * cols + rows + self.patches

    @property
    def single_tile_tokens(self) -> int:
        """Image tokens of one image in a row of several: its one tile's patches and a newline."""
        return self.patches + 1


def onevision_tower_from_config(cfg: dict[str, Any], name: str) -> LlavaOnevisionTowerSpec:
    """The LlavaOnevisionTowerSpec of a llava_onevision config.json dict; keys it omits take the config classes'
    defaults."""
    raw = cfg.get("vision_config")
    if raw is not None and not isinstance(raw, dict):
        raise SpecError(f"model {name}: vision_config must be an object, got {type(raw).__name__}")
    if raw is not None and raw.get("model_type", "siglip_vision_model") != "siglip_vision_model":
        raise SpecError(f"model {name}: llava_onevision's vision_config.model_type {raw.get('model_type')!r} is not "
                        "modelled; hpcmem models llava_onevision with a SigLIP tower (siglip_vision_model)")
    vc = {**SIGLIP_DEFAULTS, **(raw if raw is not None else ONEVISION_VISION_DEFAULTS)}
    for key in ("image_size", "patch_size"):
        if isinstance(vc[key], (list, tuple)):
            raise SpecError(f"model {name}: vision_config.{key} {vc[key]!r}: hpcmem models square images (an integer)")
    if vc.get("vision_use_head"):
        # modeling_siglip.py SiglipVisionTransformer.forward runs the attention-pooling head on every tile
        raise SpecError(f"model {name}: vision_config.vision_use_head true: SiglipVisionModel runs its attention-"
                        "pooling head on every tile, which hpcmem does not model for llava_onevision (the published "
                        "configs set it false)")
    outer = {**ONEVISION_DEFAULTS, **{k: cfg[k] for k in ONEVISION_DEFAULTS if k in cfg}}
    layer = feature_layer(outer, name)
    if outer["vision_feature_select_strategy"] != "full":
        # pack_image_features: "default" drops each tile's first patch, and the base tile's side² - 1 rows then fail
        # its check `height * width != base_image_feature.shape[0]` (a ValueError on every multi-tile image)
        raise SpecError(f"model {name}: vision_feature_select_strategy {outer['vision_feature_select_strategy']!r}: "
                        "LlavaOnevisionModel.pack_image_features needs every tile's side² rows; hpcmem models "
                        "llava_onevision with 'full' (its config's default)")
    aspect = outer["vision_aspect_ratio"]
    match = re.fullmatch(r"anyres_max_([1-9][0-9]*)", str(aspect))
    if not match:
        raise SpecError(f"model {name}: vision_aspect_ratio {aspect!r}: pack_image_features reads the maximum tile "
                        "count as int(vision_aspect_ratio.strip('anyres_max_')); hpcmem models 'anyres_max_N'")
    spec = LlavaOnevisionTowerSpec(
        model_type="llava_onevision", depth=vc["num_hidden_layers"], hidden_size=vc["hidden_size"],
        intermediate_size=vc["intermediate_size"], num_heads=vc["num_attention_heads"], in_channels=vc["num_channels"],
        image_size=vc["image_size"], patch_size=vc["patch_size"], out_hidden_size=text_width(cfg, QWEN2_HIDDEN),
        hidden_act=str(vc["hidden_act"]), projector_act=str(outer["projector_hidden_act"]),
        projector_bias=bool(outer["multimodal_projector_bias"]), feature_layer=layer, drop_class_token=False,
        fixed_resolution=False, max_num_patches=int(match.group(1)))
    # the pinpoints checked against the image size the spec has checked
    return replace(spec, grid_pinpoints=pinpoints_from_config(cfg, name, spec.image_size, DEFAULT_PINPOINTS))

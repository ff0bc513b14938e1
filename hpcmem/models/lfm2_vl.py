"""Lfm2VlTowerSpec: LFM2-VL's (model_type "lfm2_vl") SigLIP2 NaFlex tower and pixel-unshuffle projector, as its
config.json's `vision_config` and outer keys describe them, its processor's tiles and padded rows, their linears and
parameter count (transformers 5.24 models/lfm2_vl/, models/siglip2/).

- The config (configuration_lfm2_vl.py `Lfm2VlConfig`): `sub_configs_defaults` builds an omitted `vision_config` as a
  `siglip2_vision_model` (Siglip2VisionConfig's class defaults: width 768, MLP 3072, 12 layers, 12 heads, 16 px
  patches, num_patches 256, gelu_pytorch_tanh, vision_use_head true) and an omitted `text_config` as an `lfm2`
  (Lfm2Config, learned: hpcmem.models.vlm_learned); projector_hidden_size 2560, projector_bias true,
  projector_use_layernorm true, projector_hidden_act "gelu", downsample_factor 2, tie_word_embeddings true.
- The tower (modeling_lfm2_vl.py `Lfm2VlModel.vision_tower`, `AutoModel.from_config`: modeling_siglip2.py
  `Siglip2VisionModel`): `Siglip2VisionEmbeddings` (`patch_embedding` an nn.Linear(3 · patch², width) with bias over
  the processor's patchified rows, `position_embedding` an nn.Embedding of num_patches rows bilinearly resized to
  each image's grid), `Siglip2EncoderLayer`s (SigLIP's: LayerNorm, q/k/v/out_proj, LayerNorm, fc1 → act → fc2, all
  with biases: hpcmem.models.siglip `SiglipTowerCounts` counts them) under the padding mask, `post_layernorm`.
  `Lfm2VlModel.get_image_features` reads `last_hidden_state` (after post_layernorm: on the loss's path, as Cohere2
  Vision's, `ClipTowerSpec.reads_last_hidden_state`), every image's token slots gathered into one patch grid.
- The projector (`Lfm2VlMultiModalProjector`): `pixel_unshuffle` folds each downsample_factor² block of patches
  into one row of 4 · width, `layer_norm` over it (projector_use_layernorm), linear_1 (4 · width →
  projector_hidden_size) → GELU → linear_2 (→ text width), biases when projector_bias.
- The processor (image_processing_lfm2_vl.py `Lfm2VlImageProcessor`, class defaults: tile_size 512, min_tiles 2,
  max_tiles 10, use_thumbnail true, min_image_tokens 64, max_image_tokens 256, max_pixels_tolerance 2.0,
  do_image_splitting true): an image whose `smart_resize`d pixels exceed max_image_tokens · (patch · factor)² ·
  tolerance is cut into the columns × rows tiles of `_get_grid_layout` plus a thumbnail (the smart_resize'd image),
  else it is one smart_resize'd image (`lfm2_vl_tiles`); every tile or image is patchified and padded to
  `max_num_patches` rows (`pad_along_first_dim`, with a pixel_attention_mask): the tower runs that many rows per
  tile whatever its size. processing_lfm2_vl.py `Lfm2VlProcessor._build_image_tokens` writes <|image_start|>, per
  tile <|img_row_r_col_c|> and (tile / patch / factor)² image tokens, <|img_thumbnail|> and the thumbnail's tokens
  (one image alone: its tokens), <|image_end|>.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, ClassVar

from hpcmem.errors import SpecError
from hpcmem.models.clip_tower import ClipTowerSpec
from hpcmem.models.siglip import SIGLIP_ACTIVATIONS, SiglipTowerCounts
from hpcmem.models.tower_base import TowerLinear, encoder_layer_linears, fit_pixels, text_width

# configuration_siglip2.py `Siglip2VisionConfig`'s field defaults the tower reads (an omitted vision_config)
SIGLIP2_DEFAULTS: dict[str, Any] = {
    "hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
    "num_channels": 3, "patch_size": 16, "hidden_act": "gelu_pytorch_tanh", "vision_use_head": True,
    "num_patches": 256}
# Lfm2VlConfig's own defaults
LFM2_VL_DEFAULTS: dict[str, Any] = {"projector_hidden_act": "gelu", "projector_hidden_size": 2560,
                                    "projector_bias": True, "projector_use_layernorm": True, "downsample_factor": 2}
# Lfm2VlImageProcessor's class defaults (a key of the same name in the model config dict overrides one)
LFM2_VL_PROCESSOR_DEFAULTS: dict[str, Any] = {
    "tile_size": 512, "min_tiles": 2, "max_tiles": 10, "use_thumbnail": True, "min_image_tokens": 64,
    "max_image_tokens": 256, "max_pixels_tolerance": 2.0, "do_image_splitting": True}
LFM2_HIDDEN = 2560          # Lfm2Config.hidden_size: the text width of an omitted text_config


@dataclass(frozen=True, kw_only=True)
class Lfm2VlTowerSpec(SiglipTowerCounts, ClipTowerSpec):
    """A SigLIP2 NaFlex tower over padded tiles, read at last_hidden_state, under LFM2-VL's pixel-unshuffle projector."""

    scale_factor: int           # downsample_factor
    projector_hidden: int       # projector_hidden_size: linear_1's output
    projector_norm: bool        # projector_use_layernorm
    num_patches: int            # vision_config.num_patches: the position table's rows
    min_tiles: int
    max_tiles: int
    use_thumbnail: bool
    min_image_tokens: int
    max_image_tokens: int
    max_pixels_tolerance: float
    do_image_splitting: bool
    fixed_resolution: bool = False
    family: str = "lfm2_vl"
    activations: ClassVar[tuple[str, ...]] = SIGLIP_ACTIVATIONS
    reads_last_hidden_state: ClassVar[bool] = True

    @property
    def tile(self) -> int:
        """tile_size (`image_size`: the square tile the tower's rows come from)."""
        return self.image_size

    @property
    def patches(self) -> int:
        """Rows of pixel_values per tile or image: Lfm2VlImageProcessor `max_num_patches`, max(max_image_tokens ·
        factor², (tile_size / patch)² when splitting), every one padded to it."""
        tile = (self.tile // self.patch_size) ** 2 if self.do_image_splitting else 0
        return max(self.max_image_tokens * self.scale_factor ** 2, tile)

    @property
    def table_positions(self) -> int:
        return self.num_patches

    @property
    def tile_values(self) -> int:
        """Values of one tile's pixel_values: its padded rows of 3 · patch² (`convert_image_to_patches`)."""
        return self.patches * self.patch_dim

    @property
    def tokens_per_image(self) -> int:
        """The projector's rows per tile: its padded token slots, patches / factor² (get_image_features runs the
        projector on every slot and drops the padding ones after)."""
        return self.patches // self.scale_factor ** 2

    @property
    def merged_width(self) -> int:
        return self.hidden_size * self.scale_factor ** 2

    def linears(self) -> tuple[TowerLinear, ...]:
        """Every nn.Linear of the tower and the projector (peft's "all-linear" wraps each): the encoder layers', the
        patch embedding (`embeddings.patch_embedding`, an nn.Linear in Siglip2VisionEmbeddings: part "embed") and the
        projector's linear_1 and linear_2."""
        h, i, d = self.hidden_size, self.intermediate_size, self.depth
        bias = self.projector_bias
        return (*encoder_layer_linears(h, i, d),
                TowerLinear(name="embeddings.patch_embedding", in_features=self.patch_dim, out_features=h, count=1,
                            part="embed"),
                TowerLinear(name="linear_1", in_features=self.merged_width, out_features=self.projector_hidden,
                            count=1, part="merger", bias=bias),
                TowerLinear(name="linear_2", in_features=self.projector_hidden, out_features=self.out_hidden_size,
                            count=1, part="merger", bias=bias))

    @property
    def merger_params(self) -> int:
        """The projector's LayerNorm over the merged width (projector_use_layernorm) and its two linears."""
        norm = 2 * self.merged_width if self.projector_norm else 0
        return norm + sum(x.params for x in self.linears() if x.part == "merger")

    def layout(self, height: int, width: int) -> tuple[int, int, tuple[int, int]]:
        """(columns, rows, the smart_resize'd size) of one image (`lfm2_vl_tiles`)."""
        return lfm2_vl_tiles(height, width, self.patch_size, self.scale_factor, self.tile, self.min_tiles,
                             self.max_tiles, self.min_image_tokens, self.max_image_tokens, self.max_pixels_tolerance,
                             self.do_image_splitting)

    def tiles(self, height: int, width: int) -> int:
        """Images the tower runs for one image: its tiles and the thumbnail (use_thumbnail), or 1."""
        cols, rows, _ = self.layout(height, width)
        return 1 if cols * rows == 1 else cols * rows + (1 if self.use_thumbnail else 0)

    def padded(self, height: int, width: int) -> bool:
        """Whether any of the image's tiles has fewer patches than the padded rows (pixel_attention_mask has zeros)."""
        cols, rows, (h, w) = self.layout(height, width)
        small = (h // self.patch_size) * (w // self.patch_size) < self.patches
        if cols * rows == 1:
            return small
        return (self.tile // self.patch_size) ** 2 < self.patches or (self.use_thumbnail and small)

    def image_tokens(self, height: int, width: int) -> int:
        """Image tokens of one image in the text (processing_lfm2_vl.py `_get_image_num_tokens`): per tile
        ceil(tile / patch / factor)², the thumbnail's or the lone image's ceil(side / patch / factor) a side."""
        cols, rows, (h, w) = self.layout(height, width)
        f, p = self.scale_factor, self.patch_size
        own = math.ceil((h // p) / f) * math.ceil((w // p) / f)
        if cols * rows == 1:
            return own
        return cols * rows * math.ceil(self.tile // p / f) ** 2 + (own if self.use_thumbnail else 0)


def lfm2_smart_resize(height: int, width: int, patch: int, factor: int, min_tokens: int,
                      max_tokens: int) -> tuple[int, int]:
    """image_processing_lfm2_vl.py `Lfm2VlImageProcessor.smart_resize`, as (height, width): each side rounded to a
    multiple of patch · factor (`round_by_factor`: Python's round), scaled down (floor) to at most max_tokens ·
    (patch · factor)² pixels or up (ceil) to at least min_tokens · (patch · factor)²."""
    total = patch * factor
    return fit_pixels(height, width, max(total, round(height / total) * total),
                      max(total, round(width / total) * total), total, min_tokens * total ** 2,
                      max_tokens * total ** 2)


@lru_cache(maxsize=256)
def lfm2_vl_tiles(height: int, width: int, patch: int, factor: int, tile: int, min_tiles: int, max_tiles: int,
                  min_tokens: int, max_tokens: int, tolerance: float, splitting: bool) -> tuple[int, int, tuple[int, int]]:
    """(columns, rows, smart_resize'd size) of one image (Lfm2VlImageProcessor `resize_and_split`): columns × rows
    tiles (`_get_grid_layout`, `find_closest_aspect_ratio` over `_target_ratios`) when the image is too large
    (`_is_image_too_large`: its sides rounded to patch · factor, with at least one patch a side, hold more than
    max_tokens · (patch · factor)² · tolerance pixels) and splitting is on (not min_tiles == max_tiles == 1); else
    1 × 1."""
    resized = lfm2_smart_resize(height, width, patch, factor, min_tokens, max_tokens)
    if not splitting:
        min_tiles = max_tiles = 1
    total = patch * factor
    h, w = max(patch, round(height / total) * total), max(patch, round(width / total) * total)
    if not (h * w > max_tokens * total ** 2 * tolerance and not min_tiles == max_tiles == 1):
        return 1, 1, resized
    ratios = sorted({(c, r) for n in range(min_tiles, max_tiles + 1) for c in range(1, n + 1)
                     for r in range(1, n + 1) if min_tiles <= c * r <= max_tiles}, key=lambda x: x[0] * x[1])
    best, best_diff, aspect = (1, 1), float("inf"), width / height
    for c, r in ratios:
        diff = abs(aspect - c / r)
        if diff < best_diff:
            best, best_diff = (c, r), diff
        elif diff == best_diff and height * width > 0.5 * tile * tile * c * r:
            best = (c, r)
    return best[0], best[1], resized


def lfm2_vl_tower_from_config(cfg: dict[str, Any], name: str) -> Lfm2VlTowerSpec:
    """The Lfm2VlTowerSpec of an lfm2_vl config.json dict; keys it omits take the config classes' defaults, the
    processor's settings Lfm2VlImageProcessor's class defaults (a key of the same name in the config dict overrides
    one)."""
    raw = cfg.get("vision_config")
    if raw is not None and not isinstance(raw, dict):
        raise SpecError(f"model {name}: vision_config must be an object, got {type(raw).__name__}")
    raw = raw or {}
    if raw.get("model_type", "siglip2_vision_model") != "siglip2_vision_model":
        raise SpecError(f"model {name}: lfm2_vl's vision_config.model_type {raw.get('model_type')!r} is not "
                        "modelled; hpcmem models lfm2_vl with a SigLIP2 tower (siglip2_vision_model)")
    vc = {**SIGLIP2_DEFAULTS, **raw}
    if isinstance(vc["patch_size"], (list, tuple)):
        raise SpecError(f"model {name}: vision_config.patch_size {vc['patch_size']!r}: hpcmem models square patches "
                        "(an integer)")
    if vc["vision_use_head"]:
        raise SpecError(f"model {name}: vision_config.vision_use_head true (Siglip2VisionConfig's default): "
                        "Siglip2VisionModel runs its attention-pooling head on every tile and Lfm2VlModel discards "
                        "its output, which hpcmem does not model; set it false (LFM2-VL's published configs do)")
    side = math.isqrt(vc["num_patches"]) if isinstance(vc["num_patches"], int) and vc["num_patches"] > 0 else 0
    if side * side != vc["num_patches"]:
        raise SpecError(f"model {name}: vision_config.num_patches {vc['num_patches']!r} must be a square "
                        "(Siglip2VisionEmbeddings reshapes its position table to a square grid)")
    outer = {**LFM2_VL_DEFAULTS, **{k: cfg[k] for k in LFM2_VL_DEFAULTS if k in cfg}}
    proc = {**LFM2_VL_PROCESSOR_DEFAULTS, **{k: cfg[k] for k in LFM2_VL_PROCESSOR_DEFAULTS if k in cfg}}
    factor = outer["downsample_factor"]
    if not isinstance(factor, int) or isinstance(factor, bool) or factor < 1 \
            or proc["tile_size"] % (vc["patch_size"] * factor):
        raise SpecError(f"model {name}: downsample_factor {factor!r} must be a positive integer with tile_size "
                        f"{proc['tile_size']} a multiple of patch_size · downsample_factor "
                        "(Lfm2VlMultiModalProjector.pixel_unshuffle)")
    return Lfm2VlTowerSpec(
        model_type="lfm2_vl", depth=vc["num_hidden_layers"], hidden_size=vc["hidden_size"],
        intermediate_size=vc["intermediate_size"], num_heads=vc["num_attention_heads"], in_channels=vc["num_channels"],
        image_size=proc["tile_size"], patch_size=vc["patch_size"], out_hidden_size=text_width(cfg, LFM2_HIDDEN),
        hidden_act=str(vc["hidden_act"]), projector_act=str(outer["projector_hidden_act"]),
        projector_bias=bool(outer["projector_bias"]), feature_layer=-1, drop_class_token=False, scale_factor=factor,
        projector_hidden=outer["projector_hidden_size"], projector_norm=bool(outer["projector_use_layernorm"]),
        num_patches=vc["num_patches"], min_tiles=proc["min_tiles"], max_tiles=proc["max_tiles"],
        use_thumbnail=bool(proc["use_thumbnail"]), min_image_tokens=proc["min_image_tokens"],
        max_image_tokens=proc["max_image_tokens"], max_pixels_tolerance=float(proc["max_pixels_tolerance"]),
        do_image_splitting=bool(proc["do_image_splitting"]))

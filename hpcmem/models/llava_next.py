"""LlavaNextTowerSpec: LLaVA-NeXT's (and, for images, LLaVA-NeXT-Video's) vision tower, projector and "anyres" image
geometry — llava-1.5's CLIP tower and two-linear projector (hpcmem.models.clip_tower), the `image_newline`
parameter, and the tiles and image tokens one image becomes.

transformers 5.24 models/llava_next/configuration_llava_next.py `LlavaNextConfig`: llava's keys and defaults (the same
CLIP sub-config init_kwargs, vision_feature_layer -2, "default", gelu, projector bias) plus `image_grid_pinpoints`
(default [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]], (height, width) each).
modeling_llava_next.py `LlavaNextModel.__init__`: `image_newline`, one vector of the text width.

One image (image_processing_pil_llava_next.py `LlavaNextImageProcessorPil.get_image_patches`): the best-fit pinpoint
(image_processing_utils.py `select_best_resolution`), the image resized into it and padded, cut into
image_size × image_size tiles, plus the whole image resized to one more tile (the base) — `anyres_tiles`. Its image
tokens (processing_llava_next.py `LlavaNextProcessor._get_number_of_features` and `_get_unpadded_features`, minus the
class token under "default"; modeling_llava_next.py `pack_image_features` builds exactly these rows): the base tile's
patches, the tiles' patch grid with the padding rows or columns taken off, and one `image_newline` per remaining
row — `anyres_tokens`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from hpcmem.errors import SpecError
from hpcmem.models.clip_tower import ClipTowerSpec, clip_tower_from_config

# LlavaNextConfig.__post_init__'s image_grid_pinpoints when the config names none, (height, width) each
DEFAULT_PINPOINTS: tuple[tuple[int, int], ...] = ((336, 672), (672, 336), (672, 672), (1008, 336), (336, 1008))


def select_best_resolution(height: int, width: int, pinpoints: tuple[tuple[int, int], ...]) -> tuple[int, int]:
    """transformers 5.24 image_processing_utils.py `select_best_resolution`: the pinpoint (height, width) that keeps the
    most of the image's pixels once it is scaled into it (aspect kept), the least wasted area on a tie."""
    best, most, least = pinpoints[0], 0, float("inf")
    for ph, pw in pinpoints:
        scale = min(pw / width, ph / height)
        effective = min(int(width * scale) * int(height * scale), width * height)
        wasted = pw * ph - effective
        if effective > most or (effective == most and wasted < least):
            best, most, least = (ph, pw), effective, wasted
    return best


@dataclass(frozen=True, kw_only=True)
class LlavaNextTowerSpec(ClipTowerSpec):
    """llava's CLIP tower and projector with anyres tiling and an image_newline vector of the text width."""

    grid_pinpoints: tuple[tuple[int, int], ...] = DEFAULT_PINPOINTS
    fixed_resolution: bool = False

    @property
    def newline_params(self) -> int:
        """`image_newline`: one vector of the language model's width."""
        return self.out_hidden_size

    @property
    def num_params(self) -> int:
        return self.tower_params + self.merger_params + self.newline_params

    def best_resolution(self, height: int, width: int) -> tuple[int, int]:
        return select_best_resolution(height, width, self.grid_pinpoints)

    def anyres_tiles(self, height: int, width: int) -> int:
        """Tiles one height × width image becomes: the best pinpoint's image_size tiles (ceil per side: the loops of
        modeling_llava_next.py `image_size_to_num_patches`) and the base image."""
        ph, pw = self.best_resolution(height, width)
        s = self.image_size
        return -(-ph // s) * -(-pw // s) + 1

    def unpadded_grid(self, height: int, width: int) -> tuple[int, int]:
        """(rows, cols) of the tiles' patch grid once the padding rows or columns are taken off
        (processing_llava_next.py `_get_unpadded_features`, modeling_llava_next.py `unpad_image`)."""
        ph, pw = self.best_resolution(height, width)
        side = self.image_size // self.patch_size
        rows, cols = side * (ph // self.image_size), side * (pw // self.image_size)
        if width / height > cols / rows:
            kept = int(round(height * (cols / width), 7))
            rows -= (rows - kept) // 2 * 2
        else:
            kept = int(round(width * (rows / height), 7))
            cols -= (cols - kept) // 2 * 2
        return rows, cols

    def anyres_tokens(self, height: int, width: int) -> int:
        """Image tokens of one height × width image (processing_llava_next.py `_get_number_of_features`; the class
        token only under "full"): the unpadded grid, one newline per row, the base tile."""
        rows, cols = self.unpadded_grid(height, width)
        side = self.image_size // self.patch_size
        base = side * side + (0 if self.drop_class_token else 1)
        return rows * cols + rows + base


def pinpoints_from_config(cfg: dict[str, Any], name: str, image_size: int,
                          default: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    """The config's image_grid_pinpoints ((height, width) pairs, `default` when it names none), each a whole number
    of image_size tiles per side."""
    raw = cfg.get("image_grid_pinpoints")
    pins = default if raw is None else raw
    ok = isinstance(pins, (list, tuple)) and len(pins) > 0 and all(
        isinstance(p, (list, tuple)) and len(p) == 2 and all(isinstance(x, int) and not isinstance(x, bool) and x > 0
                                                              for x in p) for p in pins)
    if not ok:
        raise SpecError(f"model {name}: image_grid_pinpoints {raw!r} must be a non-empty list of [height, width] "
                        "pairs of positive integers")
    bad = [list(p) for p in pins if p[0] % image_size or p[1] % image_size]
    if bad:
        raise SpecError(f"model {name}: image_grid_pinpoints {bad} are not multiples of vision_config.image_size "
                        f"{image_size}: hpcmem models pinpoints cut into whole tiles (the published ones are)")
    return tuple((int(p[0]), int(p[1])) for p in pins)


def llava_next_tower_from_config(cfg: dict[str, Any], name: str, model_type: str = "llava_next") -> LlavaNextTowerSpec:
    """The LlavaNextTowerSpec of a llava_next config.json dict; keys it omits take LlavaNextConfig's defaults. A
    llava_next_video config (LlavaNextVideoConfig: the same keys and defaults, and its video pooler's) gives the same
    spec: for images LlavaNextVideoModel.get_image_features is LlavaNextModel's, and its `vision_resampler`
    (LlavaNextVideoPooler) runs on videos only; in its default "average" mode (and "max") it has no parameters."""
    if model_type == "llava_next_video" and cfg.get("spatial_pool_mode", "average") not in ("average", "max"):
        raise SpecError(f"model {name}: spatial_pool_mode {cfg.get('spatial_pool_mode')!r}: hpcmem models "
                        "llava_next_video's video pooler without parameters (average or max, the config's default "
                        "average); the conv pooler's Conv2d is not counted")
    base = clip_tower_from_config(cfg, name, model_type=model_type)
    return LlavaNextTowerSpec(**{f.name: getattr(base, f.name) for f in fields(base) if f.init
                                 and f.name != "fixed_resolution"},
                              grid_pinpoints=pinpoints_from_config(cfg, name, base.image_size, DEFAULT_PINPOINTS))

"""Open a vision-language processor offline, with the user's image resolution, and say whether hpcmem counts it.

Two families are counted:
- grid (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, PaddleOCR-VL): each image becomes a grid of patches and its placeholder one
  token per `merge_size`² patches (transformers `Qwen2VLProcessor.replace_image_token`: `image_grid_thw.prod() //
  merge_size**2`). The image processor resizes every image with `smart_resize` into [min_pixels, max_pixels]
  (`size = {"shortest_edge": min_pixels, "longest_edge": max_pixels}`), and `pixel_values` holds one row per patch
  (`image_grid_thw` = temporal × height × width patches per image).
- tiles (Idefics3, SmolVLM): each image is resized to `size.longest_edge`, cut into rows × cols tiles of
  `max_image_size.longest_edge` pixels plus one global tile (one tile when it fits in one), and each tile expands to
  `image_seq_len` tokens (`Idefics3Processor.replace_image_token`); `pixel_values` is [examples, tiles, 3, side,
  side], zero-padded, and the model keeps the tiles that are not all zeros (`Idefics3Model.get_image_features`:
  `real_images_inds`). The vision encoder cuts each tile into (side / patch_size)² patches, patch_size being the
  model's (`config.json` vision_config), not the processor's.
transformers is imported inside the functions.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcmem.data.errors import ProcessorUnfit

# the processor classes of each family whose counting rules hold for them
GRID_PROCESSORS = ("Qwen2VLProcessor", "Qwen2_5_VLProcessor", "Qwen3VLProcessor", "PaddleOCRVLProcessor")
TILE_PROCESSORS = ("Idefics3Processor", "SmolVLMProcessor")
# the largest pixel count accepted: a 2^15 × 2^15 image (transformers' smart_resize works in floats, not bounded)
MAX_PIXELS_LIMIT = 1 << 30


@dataclass(frozen=True)
class Resolution:
    """The image-size settings the user asked for (None: the processor's own)."""

    min_pixels: int | None = None
    max_pixels: int | None = None

    def kwargs(self) -> dict:
        """The settings given, by transformers' names."""
        return {k: v for k, v in (("min_pixels", self.min_pixels), ("max_pixels", self.max_pixels)) if v is not None}


def check_resolution(min_pixels: int | None, max_pixels: int | None) -> Resolution:
    """One-line errors for settings smart_resize cannot use: each a positive integer, min ≤ max."""
    for name, value in (("min_pixels", min_pixels), ("max_pixels", max_pixels)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or not 1 <= value <= MAX_PIXELS_LIMIT):
            raise ProcessorUnfit(f"--{name} must be an integer in 1..{MAX_PIXELS_LIMIT:,} (pixels per image); "
                                 f"got {value!r}")
    if min_pixels is not None and max_pixels is not None and min_pixels > max_pixels:
        raise ProcessorUnfit(f"--min_pixels must be ≤ --max_pixels (smart_resize fits each image into "
                             f"[min_pixels, max_pixels]); got min_pixels {min_pixels:,} > max_pixels {max_pixels:,}")
    return Resolution(min_pixels, max_pixels)


def load_processor(name_or_path: str, resolution: Resolution = Resolution()):
    """AutoProcessor from a local folder or the local cache (`local_files_only`); min_pixels / max_pixels replace the
    image processor's `size` bounds (transformers 5: `size={"shortest_edge": min_pixels, "longest_edge": max_pixels}`,
    the form its deprecation of call-time min_pixels / max_pixels asks for). A class hpcmem does not count is refused
    here, before any data is read."""
    processor = _load(name_or_path, {})
    if family(processor) == "tiles" and resolution.kwargs():
        raise ProcessorUnfit(f"--min_pixels / --max_pixels bound the Qwen2-VL family's smart_resize; "
                             f"{type(processor).__name__} resizes to size.longest_edge and tiles at "
                             "max_image_size.longest_edge instead (set them in its preprocessor config)")
    size = getattr(processor.image_processor, "size", None)
    low = resolution.min_pixels if resolution.min_pixels is not None else _get(size, "shortest_edge")
    high = resolution.max_pixels if resolution.max_pixels is not None else _get(size, "longest_edge")
    if low is not None and high is not None and low > high:
        raise ProcessorUnfit(f"--processor {name_or_path!r}: min_pixels {low:,} > max_pixels {high:,} (with "
                             f"--min_pixels / --max_pixels applied); smart_resize needs min ≤ max")
    if resolution.kwargs():
        processor = _load(name_or_path, {"size": {"shortest_edge": low, "longest_edge": high}})
    return processor


def _load(name_or_path: str, kwargs: dict):
    from transformers import AutoProcessor, ProcessorMixin
    from transformers.utils import is_torchvision_available

    try:
        processor = AutoProcessor.from_pretrained(name_or_path, local_files_only=True, **kwargs)
    except Exception as exc:  # OSError, ValueError, ImportError (a missing torchvision), …
        first = str(exc).splitlines()[0] if str(exc) else ""
        hint = "" if is_torchvision_available() else (
            "; torchvision is not installed, and transformers builds no processor with a video processor (Qwen2-VL, "
            "Qwen2.5-VL, Qwen3-VL) without it: install torchvision")
        raise ProcessorUnfit(f"--processor {name_or_path!r}: transformers could not load a processor there "
                             f"({exc.__class__.__name__}: {first[:200]}); pass a folder holding processor_config.json"
                             " / preprocessor_config.json and the tokenizer files, or a Hub name already in the local "
                             f"cache{hint}") from exc
    if not isinstance(processor, ProcessorMixin):
        raise ProcessorUnfit(f"--processor {name_or_path!r} is a {type(processor).__name__}, not a vision-language "
                             "processor; TRL trains image-text data with the model's AutoProcessor")
    return processor


def family(processor) -> str:
    """"grid" or "tiles" (module docstring); any other processor is refused in one line, never counted as text only."""
    name = type(processor).__name__
    if name not in GRID_PROCESSORS + TILE_PROCESSORS:
        raise ProcessorUnfit(f"the processor {name} is not one hpcmem lengths counts: image tokens and patches are "
                             f"implemented for {', '.join(GRID_PROCESSORS)} (one token per merge_size² patches of "
                             f"image_grid_thw) and {', '.join(TILE_PROCESSORS)} (tiles); its images would otherwise "
                             "be counted as no tokens at all")
    if getattr(processor, "image_token_id", None) is None:
        raise ProcessorUnfit(f"the processor {name} has no image_token_id: its tokenizer lacks the image token "
                             f"{getattr(processor, 'image_token', None)!r}")
    return "grid" if name in GRID_PROCESSORS else "tiles"


def tile_patches(processor, name_or_path: str) -> int:
    """Tiles family: the vision encoder's patches per tile, (tile side / vision_config.patch_size)², the patch size
    read from the model's config.json next to the processor (AutoConfig, local files only)."""
    from transformers import AutoConfig

    side = _get(getattr(processor.image_processor, "max_image_size", None), "longest_edge")
    try:
        patch = AutoConfig.from_pretrained(name_or_path, local_files_only=True).vision_config.patch_size
    except Exception as exc:  # OSError (no config.json), AttributeError (no vision_config), ValueError
        raise ProcessorUnfit(f"--processor {name_or_path!r}: {type(processor).__name__}'s tiles are cut into patches "
                             "of the vision encoder's patch_size, which is in the model's config.json (vision_config), "
                             f"not the processor's: none readable there ({exc.__class__.__name__}); pass the model "
                             "folder") from exc
    if not isinstance(side, int) or not isinstance(patch, int) or patch < 1 or side % patch:
        raise ProcessorUnfit(f"--processor {name_or_path!r}: tile side {side!r} (max_image_size.longest_edge) is not a "
                             f"multiple of the vision patch_size {patch!r}")
    return (side // patch) ** 2


def settings(processor, patches_per_tile: int | None = None) -> dict:
    """What the profile records of the processor: classes, the image token and the resolution rules."""
    ip = processor.image_processor
    size = getattr(ip, "size", None)
    if patches_per_tile is not None:
        return {"processor": type(processor).__name__, "image_processor": type(ip).__name__, "family": "tiles",
                "image_token": processor.image_token, "longest_edge": _get(size, "longest_edge"),
                "tile_size": _get(getattr(ip, "max_image_size", None), "longest_edge"),
                "image_splitting": bool(getattr(ip, "do_image_splitting", False)),
                "image_seq_len": getattr(processor, "image_seq_len", None), "patches_per_tile": patches_per_tile}
    return {"processor": type(processor).__name__, "image_processor": type(ip).__name__, "family": "grid",
            "image_token": processor.image_token, "min_pixels": _get(size, "shortest_edge"),
            "max_pixels": _get(size, "longest_edge"), "patch_size": getattr(ip, "patch_size", None),
            "merge_size": getattr(ip, "merge_size", None),
            "temporal_patch_size": getattr(ip, "temporal_patch_size", None)}


def _get(size, key: str):
    """A SizeDict or a plain dict's entry (transformers 5 keeps `size` as a SizeDict)."""
    if size is None:
        return None
    return size.get(key) if isinstance(size, dict) else getattr(size, key, None)

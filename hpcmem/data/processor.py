"""Open a vision-language processor offline, with the user's image resolution, and say whether hpcmem counts it.

The processors counted are those that turn each image into a grid of patches and expand its placeholder to one token
per `merge_size`² patches (transformers `Qwen2VLProcessor.replace_image_token`: `image_grid_thw.prod() //
merge_size**2`; the same in Qwen2.5-VL, Qwen3-VL and PaddleOCR-VL). Their image processor resizes every image with
`smart_resize` into [min_pixels, max_pixels] (`size = {"shortest_edge": min_pixels, "longest_edge": max_pixels}`), and
`pixel_values` holds one row per patch (`image_grid_thw` = temporal × height × width patches per image).
transformers is imported inside the functions.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcmem.data.errors import ProcessorUnfit

# processor class → the family whose counting rules hold for it
GRID_PROCESSORS = ("Qwen2VLProcessor", "Qwen2_5_VLProcessor", "Qwen3VLProcessor", "PaddleOCRVLProcessor")
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
    check_family(processor)
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


def check_family(processor) -> None:
    """Refuse, in one line, a processor whose image tokens hpcmem does not count (never counted as text only)."""
    name = type(processor).__name__
    if name not in GRID_PROCESSORS:
        raise ProcessorUnfit(f"the processor {name} is not one hpcmem lengths counts: image tokens and patches are "
                             f"implemented for {', '.join(GRID_PROCESSORS)} (one token per merge_size² patches of "
                             "image_grid_thw); its images would otherwise be counted as no tokens at all")
    if getattr(processor, "image_token_id", None) is None:
        raise ProcessorUnfit(f"the processor {name} has no image_token_id: its tokenizer lacks the image token "
                             f"{getattr(processor, 'image_token', None)!r}")


def settings(processor) -> dict:
    """What the profile records of the processor: classes, the image token and the resolution rules."""
    ip = processor.image_processor
    size = getattr(ip, "size", None)
    return {"processor": type(processor).__name__, "image_processor": type(ip).__name__,
            "image_token": processor.image_token, "min_pixels": _get(size, "shortest_edge"),
            "max_pixels": _get(size, "longest_edge"), "patch_size": getattr(ip, "patch_size", None),
            "merge_size": getattr(ip, "merge_size", None),
            "temporal_patch_size": getattr(ip, "temporal_patch_size", None)}


def _get(size, key: str):
    """A SizeDict or a plain dict's entry (transformers 5 keeps `size` as a SizeDict)."""
    if size is None:
        return None
    return size.get(key) if isinstance(size, dict) else getattr(size, key, None)

"""The Unlimited-OCR pieces of a vision-language trace (hpcmem.trace.vision for the rest): the processor and its image
token.

transformers 5.24 models/unlimited_ocr/processing_unlimited_ocr.py `UnlimitedOcrProcessor` (DeepseekOcr2Processor's,
patch_size 16, downsample_ratio 4; `replace_image_token`: ⌈1024 / 16 / 4⌉ rows of as many tokens and a newline each,
one separator, and for a tiled image rows · 10 rows of columns · 10 tokens and a newline) around a PIL stand-in for
its torchvision-only `UnlimitedOcrImageProcessor` (auto/auto_mappings.py names no PIL one, and torchvision is not
installed): `DeepseekOcr2ImageProcessorPil` (image_processing_pil_deepseek_ocr2.py: the same global view, the longest
edge to `size` 1024 and padded to a square, and the same GotOcr2 canvas of tiles) at UnlimitedOcrImageProcessor's class
attributes (tile_size 640, max_patches 32), with `patches_grid` ([columns, rows] per image, [1, 1] without tiles) added
and it and num_local_patches left as lists, as `UnlimitedOcrImageProcessor._preprocess` returns them
(`skip_tensor_conversion`). The stand-in models crop_to_patches True (the class default) only.
"""

from __future__ import annotations

from typing import Any

from hpcmem.job.jobspec import JobSpec
from hpcmem.trace.pieces import chat_template, tokenizer

IMAGE_TOKEN = "<image>"
MARKERS_PER_IMAGE = 0


def is_processor(proc: Any) -> bool:
    return proc.__class__.__name__ == "UnlimitedOcrProcessor"


def image_processor() -> Any:
    from transformers.image_processing_utils import BatchFeature
    from transformers.image_utils import get_image_size
    from transformers.models.deepseek_ocr2.image_processing_pil_deepseek_ocr2 import (
        DeepseekOcr2ImageProcessorPil, get_optimal_tiled_canvas)

    class UnlimitedOcrImageProcessorPil(DeepseekOcr2ImageProcessorPil):
        """DeepseekOcr2ImageProcessorPil at UnlimitedOcrImageProcessor's settings, with its patches_grid."""

        tile_size = 640
        max_patches = 32
        model_input_names = ["pixel_values", "num_local_patches", "patches_grid"]
        skip_tensor_conversion = ["num_local_patches", "patches_grid"]

        def _preprocess(self, images, size, *args, **kwargs):
            return_tensors = kwargs.pop("return_tensors", None)
            out = super()._preprocess(images, size, *args, return_tensors=None, **kwargs)
            tile = kwargs.get("tile_size", self.tile_size)
            grids = []
            for image, tiles in zip(images, out["num_local_patches"], strict=True):
                h, w = get_image_size(image)
                grids.append(list(get_optimal_tiled_canvas((h, w), (tile, tile), kwargs.get(
                    "min_patches", self.min_patches), kwargs.get("max_patches", self.max_patches))) if tiles else
                             [1, 1])
            data = {**out, "num_local_patches": list(out["num_local_patches"]), "patches_grid": grids}
            return BatchFeature(data=data, tensor_type=return_tensors,
                                skip_tensor_conversion=self.skip_tensor_conversion)

    return UnlimitedOcrImageProcessorPil()


def processor(job: JobSpec) -> Any:
    from transformers.models.unlimited_ocr.processing_unlimited_ocr import UnlimitedOcrProcessor

    tok = tokenizer()
    tok.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    return UnlimitedOcrProcessor(image_processor=image_processor(), tokenizer=tok,
                                 chat_template=chat_template(IMAGE_TOKEN))


def token_ids(proc: Any) -> dict[str, int]:
    """UnlimitedOcrConfig's image token id in the processor's tokenizer."""
    return {"image_token_id": proc.image_token_id}

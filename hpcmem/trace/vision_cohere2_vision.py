"""The Cohere2 Vision pieces of a vision-language SFT trace (hpcmem.trace.vision for the rest): the processor, its
image token and the tokens around each image.

transformers 5.24 models/cohere2_vision/processing_cohere2_vision.py `Cohere2VisionProcessor` reads its tokens from
the tokenizer's `image_token` (<|IMG_PATCH|>, also the placeholder the chat template writes for each image),
`boi_token`, `eoi_token`, `img_line_break_token` and `image_token_id` attributes (the word tokenizer gets Aya
Vision's spellings of them added and set: hpcmem.trace.vision_aya_vision) and its tokens a tile side from the image
processor's `patch_size`; `replace_image_token` writes <|START_OF_IMG|>, per tile patch_size² image tokens and
<|IMG_LINE_BREAK|>, then <|END_OF_IMG|>: tiles + 2 markers per image, Aya Vision's count (`markers`).

Its image processor, image_processing_cohere2_vision.py `Cohere2VisionImageProcessor`, is torchvision's only. In its
place the PIL `GotOcr2ImageProcessorPil` (whose cropping, thumbnail and per-tile steps are the same) with the tile
as its size and crop_to_patches on, made to cut Cohere2's canvas (hpcmem.models.cohere2_vision `cohere2_canvas`,
least upscaling, where GotOcr2's picks the closest aspect ratio): the image is first resized to that canvas, whose
aspect ratio GotOcr2's `get_optimal_tiled_canvas` then matches exactly among the arrangements of as many tiles. The
tiles' shapes and count are Cohere2's; the thumbnail is resized from the canvas rather than the image (blank images
either way).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from hpcmem.job.jobspec import JobSpec
from hpcmem.models.cohere2_vision import cohere2_canvas
from hpcmem.trace.pieces import chat_template, tokenizer
from hpcmem.trace.vision_aya_vision import BREAK, END, PATCH, START, markers

__all__ = ["markers", "processor", "token_ids"]


@lru_cache(maxsize=1)
def _image_processor_class() -> type:
    """GotOcr2ImageProcessorPil cutting Cohere2VisionImageProcessor's canvas (the module docstring)."""
    from transformers.image_processing_utils import SizeDict
    from transformers.image_utils import ChannelDimension, infer_channel_dimension_format
    from transformers.image_transforms import to_channel_dimension_format
    from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import GotOcr2ImageProcessorPil

    class Cohere2VisionImageProcessorPil(GotOcr2ImageProcessorPil):
        def crop_image_to_patches(self, image: Any, min_patches: int, max_patches: int, use_thumbnail: bool = True,
                                  patch_size: Any = None, resample: Any = None) -> Any:
            image = to_channel_dimension_format(image, ChannelDimension.FIRST, infer_channel_dimension_format(image))
            height, width = image.shape[-2:]
            cols, rows = cohere2_canvas(height, width, patch_size.height, max_patches)
            canvas = self.resize(image, SizeDict(height=rows * patch_size.height, width=cols * patch_size.width),
                                 resample=resample)
            return super().crop_image_to_patches(canvas, cols * rows, cols * rows, use_thumbnail=use_thumbnail,
                                                 patch_size=patch_size, resample=resample)

    return Cohere2VisionImageProcessorPil


def processor(job: JobSpec) -> Any:
    from transformers.models.cohere2_vision.processing_cohere2_vision import Cohere2VisionProcessor

    v = job.model.vision
    tok = tokenizer()
    tok.add_special_tokens({"additional_special_tokens": [START, END, PATCH, BREAK]})
    for key, token in (("boi_token", START), ("eoi_token", END), ("image_token", PATCH),
                       ("img_line_break_token", BREAK)):
        setattr(tok, key, token)
    tok.image_token_id = tok.convert_tokens_to_ids(PATCH)
    images = _image_processor_class()(size={"height": v.tile, "width": v.tile}, crop_to_patches=v.crop_to_patches,
                                      min_patches=v.min_patches, max_patches=v.max_patches)
    # Cohere2VisionImageProcessor.patch_size: image tokens a tile side, the tower's patches a side over the shuffle
    images.patch_size = v.tile // (v.patch_size * v.scale_factor)
    return Cohere2VisionProcessor(image_processor=images, tokenizer=tok, chat_template=chat_template(PATCH))


def token_ids(proc: Any) -> dict[str, int]:
    """Cohere2VisionConfig's image token id (<|IMG_PATCH|>: `image_token_id`) in the processor's tokenizer."""
    return {"image_token_id": proc.image_token_id}

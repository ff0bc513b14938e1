"""The Aya Vision pieces of a vision-language SFT trace (hpcmem.trace.vision for the rest): the processor, its image
token and the tokens around each image.

transformers 5.24 models/aya_vision/processing_aya_vision.py `AyaVisionProcessor` around the PIL
`GotOcr2ImageProcessorPil` (InternVL's: the tower's tile as its size, the spec's min_patches / max_patches; the
processor's own `images_kwargs` {"crop_to_patches": True}), with `img_size` the tile and `patch_size` the tower's
patch times downsample_factor, so that `replace_image_token` writes the projector's rows per tile. Per image it writes
<|START_OF_IMG|>, for each tile but the thumbnail "TILE_k" and the tile's <|IMG_PATCH|> tokens, "TILE_GLOBAL" and
the thumbnail's (or the one tile's), <|END_OF_IMG|>: the word tokenizer gets these added as special tokens, so each
marker is one token (tiles + 2 per image). The chat template writes each image as "<image>" and the text as it is.
"""

from __future__ import annotations

from typing import Any

from hpcmem.job.images import image_geometry
from hpcmem.job.jobspec import JobSpec
from hpcmem.trace.pieces import chat_template, tokenizer

IMAGE, START, END, PATCH, BREAK = "<image>", "<|START_OF_IMG|>", "<|END_OF_IMG|>", "<|IMG_PATCH|>", "<|IMG_LINE_BREAK|>"
TILE, GLOBAL = "TILE", "TILE_GLOBAL"


def markers(job: JobSpec) -> int:
    """Tokens around one image's image tokens: start, one TILE_k per tile but the thumbnail, TILE_GLOBAL, end."""
    tiles = image_geometry(job.train, job.model.vision).grid_thw[0]
    return tiles + 2


def processor(job: JobSpec) -> Any:
    from transformers.models.aya_vision.processing_aya_vision import AyaVisionProcessor
    from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import GotOcr2ImageProcessorPil

    v = job.model.vision
    tok = tokenizer()
    tiles = [f"{TILE}_{k}" for k in range(1, v.max_patches + 1)]
    tok.add_special_tokens({"additional_special_tokens": [IMAGE, START, END, PATCH, BREAK, TILE, GLOBAL, *tiles]})
    images = GotOcr2ImageProcessorPil(size={"height": v.tile, "width": v.tile}, crop_to_patches=v.crop_to_patches,
                                      min_patches=v.min_patches, max_patches=v.max_patches)
    proc = AyaVisionProcessor(image_processor=images, tokenizer=tok, patch_size=v.patch_size * v.scale_factor,
                              img_size=v.tile, downsample_factor=1, chat_template=chat_template(IMAGE))
    proc.images_kwargs = {"crop_to_patches": v.crop_to_patches}
    return proc


def token_ids(proc: Any) -> dict[str, int]:
    """AyaVisionConfig's image token id (the <|IMG_PATCH|> token: `image_token_index`) in the processor's
    tokenizer."""
    return {"image_token_index": proc.image_token_id}

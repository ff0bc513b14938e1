"""The ERNIE-4.5-VL pieces of a vision-language trace with images (hpcmem.trace.vision for the rest): the processor,
its tokens and the tokens around each image.

transformers 5.24 models/ernie4_5_vl_moe/processing_ernie4_5_vl_moe.py `Ernie4_5_VLMoeProcessor` around the PIL
`Ernie4_5_VLMoeImageProcessorPil` (Qwen2VLImageProcessorPil's `smart_resize` and patches at temporal_patch_size 1,
patch 14, merge 2) with the job's size bounds (the class's own where the job gives none: hpcmem.models.ernie4_5_vl_moe)
and no video processor (hpcmem.trace.vision_llava `without_video`: Ernie4_5_VLMoeVideoProcessor needs torchvision; an
image-only dataset never calls it). The processor reads its six vision tokens and their ids from the tokenizer's
attributes (`__init__`: `tokenizer.image_token`, `image_start_token`, ... `image_token_id` ...), which the word
tokenizer is given with ERNIE's spellings; `replace_image_token` writes grid_t·grid_h·grid_w / merge_size² image
tokens, and `__call__` adds `moe_mm_token_type_ids` (1 on image tokens and on the image start and end markers: what
routes them to the vision experts) beside ProcessorMixin's mm_token_type_ids (`return_mm_token_type_ids = True`).
The chat template writes each image as ERNIE-4.5-VL's does, "<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|>": two
markers per image.
"""

from __future__ import annotations

from typing import Any

from hpcmem.job.images import pixel_bounds
from hpcmem.job.jobspec import JobSpec
from hpcmem.trace.pieces import chat_template, tokenizer
from hpcmem.trace.vision_llava import without_video

IMAGE, IMAGE_START, IMAGE_END = "<|IMAGE_PLACEHOLDER|>", "<|IMAGE_START|>", "<|IMAGE_END|>"
VIDEO, VIDEO_START, VIDEO_END = "<|VIDEO_PLACEHOLDER|>", "<|VIDEO_START|>", "<|VIDEO_END|>"
MARKERS_PER_IMAGE = 2
CHAT_TEMPLATE = chat_template(IMAGE_START + IMAGE + IMAGE_END)
# the tokenizer attributes Ernie4_5_VLMoeProcessor.__init__ reads, and Ernie4_5_VLMoeConfig's id keys
TOKENS = (("image_token", IMAGE), ("image_start_token", IMAGE_START), ("image_end_token", IMAGE_END),
          ("video_token", VIDEO), ("video_start_token", VIDEO_START), ("video_end_token", VIDEO_END))


def ernie_tokenizer() -> Any:
    """The word tokenizer with ERNIE-4.5-VL's six vision tokens as named special tokens (ids after the words)."""
    tok = tokenizer()
    tok.add_special_tokens({"additional_special_tokens": [token for _, token in TOKENS]})
    for key, token in TOKENS:
        setattr(tok, key, token)
        setattr(tok, f"{key}_id", tok.convert_tokens_to_ids(token))
    return tok


def processor(job: JobSpec) -> Any:
    from transformers.models.ernie4_5_vl_moe.image_processing_pil_ernie4_5_vl_moe import (
        Ernie4_5_VLMoeImageProcessorPil)
    from transformers.models.ernie4_5_vl_moe.processing_ernie4_5_vl_moe import Ernie4_5_VLMoeProcessor

    v = job.model.vision
    lo, hi = pixel_bounds(job.train, v)
    images = Ernie4_5_VLMoeImageProcessorPil(size={"shortest_edge": lo, "longest_edge": hi}, patch_size=v.patch_size,
                                             temporal_patch_size=1, merge_size=v.spatial_merge_size)
    return without_video(Ernie4_5_VLMoeProcessor)(image_processor=images, tokenizer=ernie_tokenizer(),
                                                  chat_template=CHAT_TEMPLATE)


def is_processor(proc: Any) -> bool:
    return any(c.__name__ == "Ernie4_5_VLMoeProcessor" for c in type(proc).__mro__)


def token_ids(proc: Any) -> dict[str, int]:
    """Ernie4_5_VLMoeConfig's image and video token ids and their markers' in the processor's tokenizer."""
    return {f"{key}_id": proc.tokenizer.convert_tokens_to_ids(token) for key, token in TOKENS}

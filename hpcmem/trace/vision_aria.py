"""The Aria pieces of a vision-language trace (hpcmem.trace.vision for the rest): the processor, its image token and
the tokens around each image.

The processor is transformers' own `AriaProcessor` (models/aria/processing_aria.py) around `AriaImageProcessorPil`
(image_processing_pil_aria.py: the torchvision-only `AriaImageProcessor`'s PIL twin, the same resize, padding and
pixel_mask) at the tower's max_image_size (hpcmem.models.aria), and the word tokenizer with the `image_token` and
`image_token_id` attributes `AriaProcessor.__init__` reads. Its `replace_image_token` writes
size_conversion[max_image_size] (128 at 490, 256 at 980) image tokens per crop and nothing around them, so an image
takes no marker tokens besides its image tokens (`MARKERS_PER_IMAGE`). The chat template writes each image as
"<|img|>".
"""

from __future__ import annotations

from typing import Any

from hpcmem.job.jobspec import JobSpec
from hpcmem.trace.pieces import chat_template, tokenizer

IMAGE = "<|img|>"
CHAT_TEMPLATE = chat_template(IMAGE)
MARKERS_PER_IMAGE = 0


def processor(job: JobSpec) -> Any:
    from transformers.models.aria.image_processing_pil_aria import AriaImageProcessorPil
    from transformers.models.aria.processing_aria import AriaProcessor

    v = job.model.vision
    tok = tokenizer()
    tok.add_special_tokens({"additional_special_tokens": [IMAGE]})
    tok.image_token, tok.image_token_id = IMAGE, tok.convert_tokens_to_ids(IMAGE)
    images = AriaImageProcessorPil(max_image_size=v.tile, min_image_size=v.min_image_size)
    return AriaProcessor(image_processor=images, tokenizer=tok, chat_template=CHAT_TEMPLATE,
                         size_conversion={v.tile: v.tokens_per_tile})


def is_processor(proc: Any) -> bool:
    return proc.__class__.__name__ == "AriaProcessor"


def token_ids(proc: Any) -> dict[str, int]:
    """AriaConfig's image token id (`image_token_index`, `attribute_map` image_token_id) in the tokenizer."""
    return {"image_token_index": proc.image_token_id}

"""The Janus pieces of a vision-language trace (hpcmem.trace.vision for the rest): the processor, its image token and
the tokens around each image.

transformers 5.24 models/janus/processing_janus.py `JanusProcessor` around the PIL `JanusImageProcessorPil` (the
longest edge resized to the square `size`, the rest padded with the background colour) with the tower's image size,
and `num_image_tokens` the tower's patches per image (hpcmem.models.janus). The processor reads its image, begin- and
end-of-image tokens from the tokenizer's `image_token`, `boi_token` and `eoi_token` attributes: the word tokenizer gets
them added and set (the names are those of DeepSeek's Janus tokenizer). `replace_image_token` writes boi, the image's
tokens and eoi: two markers per image. The chat template writes each image as the image token and the text as it is.
"""

from __future__ import annotations

from typing import Any

from hpcmem.job.jobspec import JobSpec
from hpcmem.trace.pieces import chat_template, tokenizer

IMAGE_TOKEN, BOI, EOI = "<image_placeholder>", "<begin_of_image>", "<end_of_image>"
MARKERS_PER_IMAGE = 2
CHAT_TEMPLATE = chat_template(IMAGE_TOKEN)


def processor(job: JobSpec) -> Any:
    from transformers.models.janus.image_processing_pil_janus import JanusImageProcessorPil
    from transformers.models.janus.processing_janus import JanusProcessor

    v = job.model.vision
    tok = tokenizer()
    tok.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN, BOI, EOI]})
    tok.image_token, tok.boi_token, tok.eoi_token = IMAGE_TOKEN, BOI, EOI
    images = JanusImageProcessorPil(size={"height": v.image_size, "width": v.image_size})
    return JanusProcessor(image_processor=images, tokenizer=tok, chat_template=CHAT_TEMPLATE,
                          num_image_tokens=v.tokens_per_image)


def token_ids(proc: Any) -> dict[str, int]:
    """JanusConfig's image token id in the processor's tokenizer."""
    return {"image_token_id": proc.tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)}

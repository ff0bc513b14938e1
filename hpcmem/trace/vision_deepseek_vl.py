"""The DeepSeek-VL pieces of a vision-language trace (hpcmem.trace.vision for the rest): the processor, its image
token and the tokens around each image.

transformers 5.24 models/deepseek_vl/processing_deepseek_vl.py `DeepseekVLProcessor` around the PIL
`DeepseekVLImageProcessorPil` (Janus's: the longest edge resized to the square `size`, the rest padded with the
background colour) with the tower's image size, and `num_image_tokens` the tower's patches per image
(hpcmem.models.deepseek_vl). The processor reads its image token from the tokenizer's `image_token` attribute (the
published tokenizer carries "<image_placeholder>"): the word tokenizer gets it added and set. `replace_image_token`
writes the image's tokens and nothing around them. The chat template writes each image as "<image_placeholder>" and
the text as it is.
"""

from __future__ import annotations

from typing import Any

from hpcmem.job.jobspec import JobSpec
from hpcmem.trace.pieces import chat_template, tokenizer

IMAGE_TOKEN = "<image_placeholder>"
MARKERS_PER_IMAGE = 0
CHAT_TEMPLATE = chat_template(IMAGE_TOKEN)


def processor(job: JobSpec) -> Any:
    from transformers.models.deepseek_vl.image_processing_pil_deepseek_vl import DeepseekVLImageProcessorPil
    from transformers.models.deepseek_vl.processing_deepseek_vl import DeepseekVLProcessor

    v = job.model.vision
    tok = tokenizer()
    tok.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    tok.image_token = IMAGE_TOKEN
    images = DeepseekVLImageProcessorPil(size={"height": v.image_size, "width": v.image_size})
    return DeepseekVLProcessor(image_processor=images, tokenizer=tok, chat_template=CHAT_TEMPLATE,
                               num_image_tokens=v.tokens_per_image)


def token_ids(proc: Any) -> dict[str, int]:
    """DeepseekVLConfig's image token id in the processor's tokenizer."""
    return {"image_token_id": proc.image_token_id}

"""The DeepSeek-VL hybrid pieces of a vision-language trace (hpcmem.trace.vision for the rest): the processor and its
image token.

transformers 5.24 models/deepseek_vl_hybrid/processing_deepseek_vl_hybrid.py `DeepseekVLHybridProcessor` around the PIL
`DeepseekVLHybridImageProcessorPil` (image_processing_pil_deepseek_vl_hybrid.py: the image's longest edge resized to
the square `high_res_size` and padded for `high_res_pixel_values`, then resized again to `size` and padded for
`pixel_values`), both set to the spec's towers (SigLIP's image_size, SAM's image_size: SamPatchEmbeddings raises on
any other), and `num_image_tokens` SigLIP's patches per image (hpcmem.models.deepseek_vl_hybrid). As DeepSeek-VL's
(hpcmem.trace.vision_deepseek_vl): the image token "<image_placeholder>" added to the word tokenizer, no tokens around
an image, the same chat template.
"""

from __future__ import annotations

from typing import Any

from hpcmem.job.jobspec import JobSpec
from hpcmem.trace.pieces import tokenizer
from hpcmem.trace.vision_deepseek_vl import CHAT_TEMPLATE, IMAGE_TOKEN

MARKERS_PER_IMAGE = 0


def processor(job: JobSpec) -> Any:
    from transformers.models.deepseek_vl_hybrid.image_processing_pil_deepseek_vl_hybrid import (
        DeepseekVLHybridImageProcessorPil)
    from transformers.models.deepseek_vl_hybrid.processing_deepseek_vl_hybrid import DeepseekVLHybridProcessor

    v = job.model.vision
    tok = tokenizer()
    tok.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    tok.image_token = IMAGE_TOKEN
    images = DeepseekVLHybridImageProcessorPil(size={"height": v.image_size, "width": v.image_size},
                                               high_res_size={"height": v.sam_image_size, "width": v.sam_image_size})
    return DeepseekVLHybridProcessor(image_processor=images, tokenizer=tok, chat_template=CHAT_TEMPLATE,
                                     num_image_tokens=v.tokens_per_image)


def token_ids(proc: Any) -> dict[str, int]:
    """DeepseekVLHybridConfig's image token id in the processor's tokenizer."""
    return {"image_token_id": proc.image_token_id}

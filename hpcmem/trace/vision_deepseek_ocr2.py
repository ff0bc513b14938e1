"""The DeepSeek-OCR 2 pieces of a vision-language trace (hpcmem.trace.vision for the rest): the processor and its
image token.

transformers 5.24 models/deepseek_ocr2/processing_deepseek_ocr2.py `DeepseekOcr2Processor` (patch_size 16,
downsample_ratio 4) around the PIL `DeepseekOcr2ImageProcessorPil` (image_processing_pil_deepseek_ocr2.py at its class
defaults: a 1024 px global view padded to a square, and 768 px tiles of GotOcr2's canvas for an image whose longest
side exceeds 768), as auto/auto_mappings.py pairs them with deepseek_ocr2. The processor expands each "<image>"
(`image_token`, added to the word tokenizer) to the image's tokens (`replace_image_token`: the global view's, each
tile's and one separator; hpcmem.models.deepseek_ocr2 `image_tokens`) and nothing around them.
"""

from __future__ import annotations

from typing import Any

from hpcmem.job.jobspec import JobSpec
from hpcmem.trace.pieces import chat_template, tokenizer

IMAGE_TOKEN = "<image>"
MARKERS_PER_IMAGE = 0


def is_processor(proc: Any) -> bool:
    return proc.__class__.__name__ == "DeepseekOcr2Processor"


def processor(job: JobSpec) -> Any:
    from transformers.models.deepseek_ocr2.image_processing_pil_deepseek_ocr2 import DeepseekOcr2ImageProcessorPil
    from transformers.models.deepseek_ocr2.processing_deepseek_ocr2 import DeepseekOcr2Processor

    tok = tokenizer()
    tok.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    return DeepseekOcr2Processor(image_processor=DeepseekOcr2ImageProcessorPil(), tokenizer=tok,
                                 chat_template=chat_template(IMAGE_TOKEN))


def token_ids(proc: Any) -> dict[str, int]:
    """DeepseekOcr2Config's image token id in the processor's tokenizer."""
    return {"image_token_id": proc.image_token_id}

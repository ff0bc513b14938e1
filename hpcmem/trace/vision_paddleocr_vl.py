"""The PaddleOCR-VL processor of a vision-language trace with images (hpcmem.trace.vision for the rest).

transformers 5.24 models/paddleocr_vl/processing_paddleocr_vl.py `PaddleOCRVLProcessor` around the PIL
`PaddleOCRVLImageProcessorPil` (Qwen2-VL's smart_resize at patch · merge_size, temporal_patch_size 1) with the job's
min_pixels / max_pixels (else the class's 384² … 1536²) and the vision config's patch and merge sizes. The processor
reads its image token from the tokenizer's `image_token` and `image_token_id` attributes, which a checkpoint's
tokenizer_config names; here Qwen's "<|image_pad|>" of hpcmem.trace.vision's tokenizer, whose vision start and end
tokens the model's M-RoPE index reads around each image (`PaddleOCRVLModel.get_rope_index`, Qwen2-VL's), as the
chat template writes them (hpcmem.trace.vision `CHAT_TEMPLATE`); `replace_image_token` writes
grid_h · grid_w / merge_size² image tokens.
"""

from __future__ import annotations

from typing import Any

from hpcmem.job.images import pixel_bounds
from hpcmem.job.jobspec import JobSpec


def processor(job: JobSpec, tokenizer: Any, chat_template: str, image_token: str) -> Any:
    """PaddleOCRVLProcessor with the word tokenizer (Qwen's vision tokens added) and the job's pixel bounds."""
    from transformers.models.paddleocr_vl.image_processing_pil_paddleocr_vl import PaddleOCRVLImageProcessorPil
    from transformers.models.paddleocr_vl.processing_paddleocr_vl import PaddleOCRVLProcessor

    v = job.model.vision
    lo, hi = pixel_bounds(job.train, v)
    tokenizer.image_token = image_token
    tokenizer.image_token_id = tokenizer.convert_tokens_to_ids(image_token)
    images = PaddleOCRVLImageProcessorPil(min_pixels=lo, max_pixels=hi, patch_size=v.patch_size,
                                          merge_size=v.spatial_merge_size)
    return PaddleOCRVLProcessor(image_processor=images, tokenizer=tokenizer, chat_template=chat_template)

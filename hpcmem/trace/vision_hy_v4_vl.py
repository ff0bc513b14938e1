"""The HY-V4-VL processor of a vision-language trace with images (hpcmem.trace.vision for the rest).

transformers 5.24 models/hy_v4_vl/processing_hy_v4_vl.py `HYV4VLProcessor` (`return_mm_token_type_ids = True`, which
HYV4VLModel's M-RoPE index needs; its image token "<|image_pad|>" where the tokenizer names none) around the PIL
`HYV4VLImageProcessorPil` (HunYuanVL's: Qwen2-VL's `smart_resize` at patch 16, merge 2, one frame, 512² … 2048² pixels by
default) with the job's size bounds (the class's own where the job gives none: hpcmem.models.hy_v4_vl), the word
tokenizer with Qwen's vision tokens (hpcmem.trace.vision `vision_tokenizer`), and no video processor
(hpcmem.trace.vision_llava `without_video`: HYV4VLVideoProcessor needs torchvision; an image-only dataset never calls
it). `replace_image_token` writes patch_h · (patch_w + 1) image tokens; the chat template and the two markers per image
are the trace's Qwen ones (the model places images by mm_token_type_ids, not by markers).
"""

from __future__ import annotations

from typing import Any

from hpcmem.job.images import pixel_bounds
from hpcmem.job.jobspec import JobSpec
from hpcmem.trace.vision_llava import without_video


def processor(job: JobSpec, tokenizer: Any, chat_template: str) -> Any:
    from transformers.models.hy_v4_vl.image_processing_pil_hy_v4_vl import HYV4VLImageProcessorPil
    from transformers.models.hy_v4_vl.processing_hy_v4_vl import HYV4VLProcessor

    v = job.model.vision
    lo, hi = pixel_bounds(job.train, v)
    images = HYV4VLImageProcessorPil(size={"shortest_edge": lo, "longest_edge": hi}, patch_size=v.patch_size,
                                     temporal_patch_size=1, merge_size=v.spatial_merge_size)
    return without_video(HYV4VLProcessor)(image_processor=images, tokenizer=tokenizer, chat_template=chat_template)

"""The VideoLLaMA3 pieces of a vision-language trace with images (hpcmem.trace.vision for the rest): the processor,
its image token and the tokens around each image.

transformers 5.24 models/video_llama_3/processing_video_llama_3.py `VideoLlama3Processor` around the PIL
`VideoLlama3ImageProcessorPil` (Qwen2-VL's smart_resize, merge_size 1 for images) with the job's min_pixels /
max_pixels and the vision config's patch size, and no video processor (hpcmem.trace.vision_llava `without_video`:
it needs torchvision; an image-only dataset never calls it). The processor reads its image token from the tokenizer's
`image_token` attribute, else "<|image_pad|>" (Qwen's, which hpcmem.trace.vision's tokenizer carries);
`replace_image_token` writes grid_h · grid_w / merge_size² image tokens and nothing around them. The chat template
writes each image as "<|image_pad|>" and the text as it is.
"""

from __future__ import annotations

from typing import Any

from hpcmem.job.images import pixel_bounds
from hpcmem.job.jobspec import JobSpec
from hpcmem.trace.pieces import chat_template
from hpcmem.trace.vision_llava import without_video

IMAGE_TOKEN, VIDEO_TOKEN = "<|image_pad|>", "<|video_pad|>"
MARKERS_PER_IMAGE = 0
CHAT_TEMPLATE = chat_template(IMAGE_TOKEN)
IMAGE_PROCESSOR = "VideoLlama3ImageProcessorPil"


def processor(job: JobSpec, tokenizer: Any) -> Any:
    """VideoLlama3Processor with the word tokenizer (Qwen's vision tokens added) and the job's pixel bounds."""
    from transformers.models.video_llama_3.image_processing_pil_video_llama_3 import VideoLlama3ImageProcessorPil
    from transformers.models.video_llama_3.processing_video_llama_3 import VideoLlama3Processor

    v = job.model.vision
    lo, hi = pixel_bounds(job.train)
    images = VideoLlama3ImageProcessorPil(min_pixels=lo, max_pixels=hi, patch_size=v.patch_size,
                                          merge_size=v.spatial_merge_size)
    return without_video(VideoLlama3Processor)(image_processor=images, tokenizer=tokenizer,
                                               chat_template=CHAT_TEMPLATE)


def is_processor(proc: Any) -> bool:
    return getattr(proc, "image_processor", None).__class__.__name__ == IMAGE_PROCESSOR


def token_ids(proc: Any) -> dict[str, int]:
    """VideoLlama3Config's image and video token ids in the processor's tokenizer."""
    return {"image_token_id": proc.image_token_id, "video_token_id": proc.video_token_id}

"""The GLM-4.1V pieces of a vision-language trace with images (hpcmem.trace.vision for the rest): the processor, its
tokens and the tokens around each image.

transformers 5.24 models/glm4v/processing_glm4v.py `Glm4vProcessor` around the PIL `Glm4vImageProcessorPil` (the
torchvision one's `smart_resize` and `patchify`) with the job's size bounds (the class's own where the job gives none:
hpcmem.models.glm4v) and the vision config's patch geometry, and no video processor (hpcmem.trace.vision_llava
`without_video`: it needs torchvision; an image-only dataset never calls it). The processor reads its image and video
tokens from the tokenizer ("<|image|>", "<|video|>" where the tokenizer names none) and the video markers by their
spellings (`__init__`); `replace_image_token` writes grid_t·grid_h·grid_w / merge_size² image tokens. The chat
template writes each image as GLM-4.1V's does, "<|begin_of_image|><|image|><|end_of_image|>": two markers per image.
"""

from __future__ import annotations

from typing import Any

from hpcmem.job.images import pixel_bounds
from hpcmem.job.jobspec import JobSpec
from hpcmem.trace.pieces import chat_template, tokenizer
from hpcmem.trace.vision_llava import without_video

BEGIN_IMAGE, END_IMAGE, IMAGE, VIDEO = "<|begin_of_image|>", "<|end_of_image|>", "<|image|>", "<|video|>"
BEGIN_VIDEO, END_VIDEO = "<|begin_of_video|>", "<|end_of_video|>"
MARKERS_PER_IMAGE = 2
CHAT_TEMPLATE = chat_template(BEGIN_IMAGE + IMAGE + END_IMAGE)
PROCESSOR = "Glm4vProcessor"


def processor(job: JobSpec) -> Any:
    """Glm4vProcessor with the word tokenizer (GLM-4.1V's six vision tokens added) and the job's size bounds."""
    from transformers.models.glm4v.image_processing_pil_glm4v import Glm4vImageProcessorPil
    from transformers.models.glm4v.processing_glm4v import Glm4vProcessor

    v = job.model.vision
    lo, hi = pixel_bounds(job.train, v)
    tok = tokenizer()
    tok.add_special_tokens({"additional_special_tokens": [BEGIN_IMAGE, END_IMAGE, IMAGE, VIDEO, BEGIN_VIDEO,
                                                          END_VIDEO]})
    images = Glm4vImageProcessorPil(size={"shortest_edge": lo, "longest_edge": hi}, patch_size=v.patch_size,
                                    temporal_patch_size=v.temporal_patch_size, merge_size=v.spatial_merge_size)
    return without_video(Glm4vProcessor)(image_processor=images, tokenizer=tok, chat_template=CHAT_TEMPLATE)


def is_processor(proc: Any) -> bool:
    return any(c.__name__ == PROCESSOR for c in type(proc).__mro__)


def token_ids(proc: Any) -> dict[str, int]:
    """Glm4vConfig's image and video token ids and their markers' in the processor's tokenizer."""
    ids = proc.tokenizer.convert_tokens_to_ids([IMAGE, VIDEO, BEGIN_IMAGE, END_IMAGE, BEGIN_VIDEO, END_VIDEO])
    return dict(zip(("image_token_id", "video_token_id", "image_start_token_id", "image_end_token_id",
                     "video_start_token_id", "video_end_token_id"), ids, strict=True))

"""The Cohere Compass pieces of a vision-language trace (hpcmem.trace.vision for the rest): the processor, its tokens.

transformers 5.24 models/cohere_compass/processing_cohere_compass.py `CohereCompassProcessor` is Qwen3-VL's processor
with its own spellings of the four vision tokens, "<|IMAGE_PAD|>", "<|VIDEO_PAD|>", "<|VISION_START|>" and
"<|VISION_END|>", set in `__init__` whatever the tokenizer says (their ids read from the tokenizer); its
`replace_image_token` writes grid_t·grid_h·grid_w / merge_size² image tokens, Qwen's count. Its PIL image processor
`CohereCompassImageProcessorPil` (image_processing_pil_cohere_compass.py, the auto mapping's "pil" entry) is
Qwen2-VL's resize and patchify, taken with the job's size bounds and the vision config's patch geometry. The chat
template writes each image as "<|VISION_START|><|IMAGE_PAD|><|VISION_END|>": two markers per image, as Qwen's.
"""

from __future__ import annotations

from typing import Any

from hpcmem.job.images import pixel_bounds
from hpcmem.job.jobspec import JobSpec
from hpcmem.trace.pieces import chat_template, tokenizer
from hpcmem.trace.vision_llava import without_video

IMAGE, VIDEO, START, END = "<|IMAGE_PAD|>", "<|VIDEO_PAD|>", "<|VISION_START|>", "<|VISION_END|>"
CHAT_TEMPLATE = chat_template(START + IMAGE + END)


def processor(job: JobSpec) -> Any:
    """CohereCompassProcessor around its PIL image processor, the word tokenizer with its four vision tokens added, no
    video processor (hpcmem.trace.vision_llava `without_video`: it needs torchvision)."""
    from transformers.models.cohere_compass.image_processing_pil_cohere_compass import CohereCompassImageProcessorPil
    from transformers.models.cohere_compass.processing_cohere_compass import CohereCompassProcessor

    v = job.model.vision
    lo, hi = pixel_bounds(job.train, v)
    tok = tokenizer()
    tok.add_special_tokens({"additional_special_tokens": [START, END, IMAGE, VIDEO]})
    images = CohereCompassImageProcessorPil(size={"shortest_edge": lo, "longest_edge": hi}, patch_size=v.patch_size,
                                            temporal_patch_size=v.temporal_patch_size, merge_size=v.spatial_merge_size)
    return without_video(CohereCompassProcessor)(image_processor=images, tokenizer=tok, chat_template=CHAT_TEMPLATE)


def is_processor(proc: Any) -> bool:
    return any(c.__name__ == "CohereCompassProcessor" for c in type(proc).__mro__)


def token_ids(proc: Any) -> dict[str, int]:
    """CohereCompassConfig's vision token ids in the processor's tokenizer."""
    ids = proc.tokenizer.convert_tokens_to_ids([START, END, IMAGE, VIDEO])
    return dict(zip(("vision_start_token_id", "vision_end_token_id", "image_token_id", "video_token_id"), ids,
                    strict=True))

"""The MiniMax M3 VL pieces of a vision-language trace with images (hpcmem.trace.vision for the rest): the processor,
its tokens and the tokens around each image.

transformers 5.24 models/minimax_m3_vl/processing_minimax_m3_vl.py `MiniMaxM3VLProcessor` reads its four vision
tokens' ids from the tokenizer by their class spellings (`IMAGE_TOKEN` "]<]image[>[", `VIDEO_TOKEN`,
`VISION_START_TOKEN`, `VISION_END_TOKEN`), which the word tokenizer gets as special tokens; `replace_image_token`
writes each image placeholder as the start marker, grid_t · grid_h · grid_w / merge_size² image tokens and the end
marker: the chat template writes the placeholder alone, and each image takes two markers.

Its image processor, image_processing_minimax_m3_vl.py `MiniMaxM3VLImageProcessor`, is torchvision's only (the auto
mapping names no PIL one). In its place transformers' own `Qwen2VLImageProcessorPil`, whose arithmetic the MiniMax
class copies (modular_minimax_m3_vl.py: `MiniMaxM3VLImageProcessor(Qwen2VLImageProcessor)`, only the class `size`
changed): smart_resize at factor patch · merge_size, temporal_patch_size 2, the same patchify layout, OpenAI CLIP's
mean and std, with MiniMax's size bounds (hpcmem.models.minimax_m3_vl `MINIMAX_M3_PIXELS`, or the job's) and the
vision config's patch geometry; the resize itself is PIL's bicubic where torchvision's would run (blank images either
way). Its video processor needs torchvision, which an image-only dataset never calls: left out (None).
"""

from __future__ import annotations

from typing import Any

from hpcmem.job.images import pixel_bounds
from hpcmem.job.jobspec import JobSpec
from hpcmem.trace.pieces import chat_template, tokenizer

IMAGE, VIDEO = "]<]image[>[", "]<]video[>["
VISION_START, VISION_END = "]<]start of image[>[", "]<]end of image[>["
MARKERS_PER_IMAGE = 2
CHAT_TEMPLATE = chat_template(IMAGE)


def processor(job: JobSpec) -> Any:
    from transformers.models.minimax_m3_vl.processing_minimax_m3_vl import MiniMaxM3VLProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    class ImageOnlyProcessor(MiniMaxM3VLProcessor):
        def check_argument_for_proper_class(self, argument_name: str, argument: Any) -> Any:
            if argument_name == "video_processor" and argument is None:
                return None
            if argument_name == "image_processor" and isinstance(argument, Qwen2VLImageProcessorPil):
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    v = job.model.vision
    lo, hi = pixel_bounds(job.train, v)
    images = Qwen2VLImageProcessorPil(size={"shortest_edge": lo, "longest_edge": hi}, patch_size=v.patch_size,
                                      temporal_patch_size=v.temporal_patch_size, merge_size=v.spatial_merge_size)
    tok = tokenizer()
    tok.add_special_tokens({"additional_special_tokens": [IMAGE, VIDEO, VISION_START, VISION_END]})
    return ImageOnlyProcessor(image_processor=images, tokenizer=tok, video_processor=None,
                              chat_template=CHAT_TEMPLATE)


def is_processor(proc: Any) -> bool:
    return any(c.__name__ == "MiniMaxM3VLProcessor" for c in type(proc).__mro__)


def token_ids(proc: Any) -> dict[str, int]:
    """MiniMaxM3VLConfig's image and video token ids (`image_token_index`, `video_token_index`) in the processor's
    tokenizer."""
    return {"image_token_id": proc.image_token_id, "video_token_id": proc.video_token_id}

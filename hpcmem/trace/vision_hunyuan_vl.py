"""The HunYuanVL processor of a vision-language trace with images (hpcmem.trace.vision for the rest).

transformers 5.24 models/hunyuan_vl/processing_hunyuan_vl.py `HunYuanVLProcessor` (an image processor and a
tokenizer, no video processor; `return_mm_token_type_ids = True`, which HunYuanVLModel's M-RoPE index needs) around the
PIL `HunYuanVLImageProcessorPil` (image_processing_auto.py's "pil" row for hunyuan_vl: Qwen2-VL's `smart_resize` at
patch 16, merge 2, one frame) with the job's size bounds (the class's own where the job gives none:
hpcmem.models.hunyuan_vl), and the word tokenizer with three image tokens. The processor reads its tokens from the
tokenizer's attributes (image_token, image_start_token, image_end_token and their ids, which a HunYuan checkpoint's
tokenizer_config names in `extra_special_tokens`; the spellings here are the trace's own) and refuses a prompt whose
image placeholder is not written start, image, end (`validate_inputs`): the chat template writes each image so, two
markers around the image tokens `replace_image_token` expands (patch_h · (patch_w + 1) + 2).
"""

from __future__ import annotations

from typing import Any

from hpcmem.job.images import pixel_bounds
from hpcmem.job.jobspec import JobSpec
from hpcmem.trace.pieces import chat_template, tokenizer

IMAGE_START, IMAGE, IMAGE_END = "<hy_image_start>", "<hy_image>", "<hy_image_end>"
MARKERS_PER_IMAGE = 2
CHAT_TEMPLATE = chat_template(IMAGE_START + IMAGE + IMAGE_END)


def processor(job: JobSpec) -> Any:
    from transformers.models.hunyuan_vl.image_processing_pil_hunyuan_vl import HunYuanVLImageProcessorPil
    from transformers.models.hunyuan_vl.processing_hunyuan_vl import HunYuanVLProcessor

    v = job.model.vision
    lo, hi = pixel_bounds(job.train, v)
    tok = tokenizer()
    tok.add_special_tokens({"additional_special_tokens": [IMAGE_START, IMAGE, IMAGE_END]})
    for attr, token in (("image_token", IMAGE), ("image_start_token", IMAGE_START), ("image_end_token", IMAGE_END)):
        setattr(tok, attr, token)
        setattr(tok, f"{attr}_id", tok.convert_tokens_to_ids(token))
    images = HunYuanVLImageProcessorPil(size={"shortest_edge": lo, "longest_edge": hi}, patch_size=v.patch_size,
                                        temporal_patch_size=1, merge_size=v.spatial_merge_size)
    return HunYuanVLProcessor(image_processor=images, tokenizer=tok, chat_template=CHAT_TEMPLATE)


def is_processor(proc: Any) -> bool:
    return any(c.__name__ == "HunYuanVLProcessor" for c in type(proc).__mro__)


def token_ids(proc: Any) -> dict[str, int]:
    """HunYuanVLConfig's image token id and its markers' in the processor's tokenizer (the model reads
    image_token_id; the markers are text to it)."""
    return {"image_token_id": proc.image_token_id, "im_start_id": proc.image_start_token_id,
            "im_end_id": proc.image_end_token_id}

"""The GLM-4.1V pieces of a vision-language trace with images (hpcmem.trace.vision for the rest): the processor, its
tokens and the tokens around each image.

transformers 5.24 models/glm4v/processing_glm4v.py `Glm4vProcessor` (glm46v's and glmga's: models/glm46v/
processing_glm46v.py `Glm46VProcessor`, the same image path: `PROCESSORS`) around the PIL `Glm4vImageProcessorPil` (the
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
# model_type → (module, processor class, module of the PIL image processor, its class): transformers' auto
# mappings (processing_auto.py, image_processing_auto.py in auto_mappings.py). glmga names no processor there; its
# model class is Glm46V's (modeling_auto.py), so its processor is taken as Glm46VProcessor around
# GlmgaImageProcessorPil, whose `_preprocess` resizes by patch_size · merge_size (its patch_expand_factor, 1 by
# default, only in the torchvision one's)
PROCESSORS = {"glm4v": ("glm4v.processing_glm4v", "Glm4vProcessor", "glm4v.image_processing_pil_glm4v",
                        "Glm4vImageProcessorPil"),
              "glm46v": ("glm46v.processing_glm46v", "Glm46VProcessor", "glm46v.image_processing_pil_glm46v",
                         "Glm46VImageProcessorPil"),
              "glmga": ("glm46v.processing_glm46v", "Glm46VProcessor", "glmga.image_processing_pil_glmga",
                        "GlmgaImageProcessorPil"),
              # glm_ocr: no processor or image processor in transformers' auto mappings either; the model's own
              # class is Glm4v's computation, and ports of GLM-OCR name Glm46VProcessor (mlx-vlm
              # mlx_vlm/models/glm_ocr/__init__.py), so Glm46V's processor and PIL image processor
              "glm_ocr": ("glm46v.processing_glm46v", "Glm46VProcessor", "glm46v.image_processing_pil_glm46v",
                          "Glm46VImageProcessorPil"),
              # glm4v_moe: no mapping row either; GLM-4.5V's processor is GLM-4.1V's (its checkpoints name
              # Glm4vProcessor and Glm4vImageProcessor, and its image path is glm4v's classes)
              "glm4v_moe": ("glm4v.processing_glm4v", "Glm4vProcessor", "glm4v.image_processing_pil_glm4v",
                            "Glm4vImageProcessorPil")}


def processor(job: JobSpec) -> Any:
    """The type's processor (`PROCESSORS`) with the word tokenizer (GLM-4.1V's six vision tokens added) and the job's
    size bounds."""
    import importlib

    v = job.model.vision
    proc_mod, proc_cls, img_mod, img_cls = PROCESSORS[v.model_type]
    processor_class = getattr(importlib.import_module(f"transformers.models.{proc_mod}"), proc_cls)
    image_class = getattr(importlib.import_module(f"transformers.models.{img_mod}"), img_cls)
    lo, hi = pixel_bounds(job.train, v)
    tok = tokenizer()
    tok.add_special_tokens({"additional_special_tokens": [BEGIN_IMAGE, END_IMAGE, IMAGE, VIDEO, BEGIN_VIDEO,
                                                          END_VIDEO]})
    images = image_class(size={"shortest_edge": lo, "longest_edge": hi}, patch_size=v.patch_size,
                         temporal_patch_size=v.temporal_patch_size, merge_size=v.spatial_merge_size)
    return without_video(processor_class)(image_processor=images, tokenizer=tok, chat_template=CHAT_TEMPLATE)


def is_processor(proc: Any) -> bool:
    names = {x[1] for x in PROCESSORS.values()}
    return any(c.__name__ in names for c in type(proc).__mro__)


def token_ids(proc: Any) -> dict[str, int]:
    """Glm4vConfig's image and video token ids and their markers' in the processor's tokenizer."""
    ids = proc.tokenizer.convert_tokens_to_ids([IMAGE, VIDEO, BEGIN_IMAGE, END_IMAGE, BEGIN_VIDEO, END_VIDEO])
    return dict(zip(("image_token_id", "video_token_id", "image_start_token_id", "image_end_token_id",
                     "video_start_token_id", "video_end_token_id"), ids, strict=True))

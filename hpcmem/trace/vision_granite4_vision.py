"""The Granite 4 Vision processor of a vision-language trace with images (hpcmem.trace.vision for the rest).

transformers 5.24 models/granite4_vision/processing_granite4_vision.py `Granite4VisionProcessor` (LlavaNextProcessor's
text expansion, its `_get_number_of_features` scaling the patch grid by `downsample_rate`) around the PIL
`LlavaNextImageProcessorPil` (models/auto/image_processing_auto.py's "pil" row for granite4_vision; the torchvision
LlavaNextImageProcessor needs torchvision, absent here: both cut the same anyres tiles) with the tower's image size as
its shortest edge and crop and the config's image_grid_pinpoints, patch_size, vision_feature_select_strategy "full"
and num_additional_image_tokens 0 (the released checkpoints' processor_config.json), and the word tokenizer with
"<image>" added. The chat template writes each image as "<image>" with no markers (llava's, hpcmem.trace.vision_llava).
"""

from __future__ import annotations

from typing import Any

from hpcmem.job.jobspec import JobSpec
from hpcmem.trace.pieces import tokenizer
from hpcmem.trace.vision_llava import CHAT_TEMPLATE, IMAGE_TOKEN

MARKERS_PER_IMAGE = 0


def processor(job: JobSpec) -> Any:
    from transformers.models.granite4_vision.processing_granite4_vision import Granite4VisionProcessor
    from transformers.models.llava_next.image_processing_pil_llava_next import LlavaNextImageProcessorPil

    v = job.model.vision
    tok = tokenizer()
    tok.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    images = LlavaNextImageProcessorPil(size={"shortest_edge": v.image_size},
                                        crop_size={"height": v.image_size, "width": v.image_size},
                                        image_grid_pinpoints=[list(p) for p in v.grid_pinpoints])
    return Granite4VisionProcessor(image_processor=images, tokenizer=tok, patch_size=v.patch_size,
                                   vision_feature_select_strategy="full", num_additional_image_tokens=0,
                                   downsample_rate=f"{v.query_side}/{v.window_side}", chat_template=CHAT_TEMPLATE)

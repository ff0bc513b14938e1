"""The InternVL pieces of a vision-language SFT trace (hpcmem.trace.vision for the rest): the processor, its image
token and the tokens around each image.

transformers 5.24 models/internvl/processing_internvl.py `InternVLProcessor` around the PIL
`GotOcr2ImageProcessorPil` (models/got_ocr2/image_processing_pil_got_ocr2.py) with the tower's tile as its size and
the spec's min_patches / max_patches (hpcmem.models.internvl); the processor's own `images_kwargs`
({"crop_to_patches": True}) and the spec's crop_to_patches are what every call runs with. `image_seq_length` is the
tower's tokens per tile. The processor reads its four tokens from the tokenizer's attributes (`start_image_token`,
`end_image_token`, `context_image_token`, `video_token` and their ids, which InternVL's Qwen2 tokenizer carries as
extra special tokens): the word tokenizer gets them added and set. `replace_image_token` writes <img>, the tile
count × image_seq_length <IMG_CONTEXT> tokens and </img> per image: two tokens around each image's tokens. The
video processor is left out (`without_video`). The chat template writes each image as "<IMG_CONTEXT>" and the text
as it is.

Qianfan-OCR (models/qianfan_ocr/modular_qianfan_ocr.py `QianfanOCRProcessor(InternVLProcessor)`): the same image
processor, tokenizer attributes and replacement, built without a video processor; its chat template's image
placeholder is `image_placeholder_token` ("<image>"), which `get_text_with_replacements` expands.
"""

from __future__ import annotations

from typing import Any

from hpcmem.job.jobspec import JobSpec
from hpcmem.trace.pieces import chat_template, tokenizer
from hpcmem.trace.vision_llava import without_video

START, END, CONTEXT, VIDEO = "<img>", "</img>", "<IMG_CONTEXT>", "<video>"
QIANFAN_PLACEHOLDER = "<image>"
MARKERS_PER_IMAGE = 2


CHAT_TEMPLATE = chat_template(CONTEXT)


def processor(job: JobSpec) -> Any:
    from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import GotOcr2ImageProcessorPil
    from transformers.models.internvl.processing_internvl import InternVLProcessor
    from transformers.models.qianfan_ocr.processing_qianfan_ocr import QianfanOCRProcessor

    v = job.model.vision
    tok = tokenizer()
    tok.add_special_tokens({"additional_special_tokens": [START, END, CONTEXT, VIDEO]})
    for attr, token in (("start_image_token", START), ("end_image_token", END), ("context_image_token", CONTEXT),
                        ("video_token", VIDEO)):
        setattr(tok, attr, token)
        setattr(tok, f"{attr}_id", tok.convert_tokens_to_ids(token))
    images = GotOcr2ImageProcessorPil(size={"height": v.tile, "width": v.tile}, crop_to_patches=v.crop_to_patches,
                                      min_patches=v.min_patches, max_patches=v.max_patches)
    if v.model_type == "qianfan_ocr":
        proc = QianfanOCRProcessor(image_processor=images, tokenizer=tok, image_seq_length=v.tokens_per_image,
                                   chat_template=chat_template(QIANFAN_PLACEHOLDER))
    else:
        proc = without_video(InternVLProcessor)(image_processor=images, tokenizer=tok, video_processor=None,
                                                image_seq_length=v.tokens_per_image, chat_template=CHAT_TEMPLATE)
    # the class attribute images_kwargs {"crop_to_patches": True} overrides the image processor's; a spec that turns
    # tiling off passes it on as the user's processor would
    proc.images_kwargs = {"crop_to_patches": v.crop_to_patches}
    return proc


def token_ids(proc: Any) -> dict[str, int]:
    """InternVLConfig's image token id (the <IMG_CONTEXT> token) in the processor's tokenizer."""
    return {"image_token_id": proc.tokenizer.convert_tokens_to_ids(CONTEXT)}

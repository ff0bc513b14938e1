"""The Ovis2 pieces of a vision-language trace (hpcmem.trace.vision for the rest): the processor, its image token and
the tokens around each image.

transformers 5.24 models/ovis2/processing_ovis2.py `Ovis2Processor` around the PIL `Ovis2ImageProcessorPil` with the
tower's image size (`crop_to_patches` False, its default: every image resized to one tile), and `image_seq_length`
the tower's image tokens per tile (hpcmem.models.ovis2). The chat template writes each image as "<image>", which
`replace_image_token` expands to <IMG_START>, image_seq_length <IMG_ATOM>, <IMG_GRID> and <IMG_END> for a one-tile
grid: three markers per image. The word tokenizer gets these tokens added; the model's `image_token_id` is
<IMG_ATOM>'s id and its `visual_indicator_token_ids` those of <IMG_START>, <IMG_GRID>, <IMG_COL>, <IMG_ROW> and
<IMG_END> (the five indicator rows of the visual embedding table).
"""

from __future__ import annotations

from typing import Any

from hpcmem.job.jobspec import JobSpec
from hpcmem.trace.pieces import chat_template, tokenizer

IMAGE_TOKEN, ATOM = "<image>", "<IMG_ATOM>"
INDICATORS = ("<IMG_START>", "<IMG_GRID>", "<IMG_COL>", "<IMG_ROW>", "<IMG_END>")
MARKERS_PER_IMAGE = 3
CHAT_TEMPLATE = chat_template(IMAGE_TOKEN)


def processor(job: JobSpec) -> Any:
    from transformers.models.ovis2.image_processing_pil_ovis2 import Ovis2ImageProcessorPil
    from transformers.models.ovis2.processing_ovis2 import Ovis2Processor

    v = job.model.vision
    tok = tokenizer()
    tok.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN, ATOM, *INDICATORS]})
    images = Ovis2ImageProcessorPil(size={"height": v.image_size, "width": v.image_size})
    return Ovis2Processor(image_processor=images, tokenizer=tok, chat_template=CHAT_TEMPLATE,
                          image_seq_length=v.tokens_per_image)


def token_ids(proc: Any) -> dict[str, Any]:
    """Ovis2Config's image token and indicator token ids in the processor's tokenizer."""
    return {"image_token_id": proc.tokenizer.convert_tokens_to_ids(ATOM),
            "visual_indicator_token_ids": proc.tokenizer.convert_tokens_to_ids(list(INDICATORS))}

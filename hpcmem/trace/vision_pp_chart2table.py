"""The PP-Chart2Table pieces of a vision-language trace (hpcmem.trace.vision for the rest): the processor, its image
token and the tokens around each image.

transformers 5.24 models/pp_chart2table/processing_pp_chart2table.py `PPChart2TableProcessor` (a bare ProcessorMixin:
it checks that text and images are both given and calls the image processor and the tokenizer; with no
`image_token` attribute it expands nothing, processing_utils.py `ProcessorMixin._process_images`) around the PIL
`PPChart2TableImageProcessorPil` (image_processing_pil_pp_chart2table.py: a resize to a fixed square) at the tower's
image_size, which `GotOcr2PatchEmbeddings.forward` requires. The image's tokens are therefore the chat template's:
it writes each image as <img>, the tower's image tokens of <imgpad> (hpcmem.models.got_ocr2_tower
`tokens_per_image`) and </img>, as GOT-OCR 2.0's prompt does: two markers per image. The word tokenizer gets the
three tokens added; the model's `image_token_index` is <imgpad>'s id.
"""

from __future__ import annotations

from typing import Any

from hpcmem.job.jobspec import JobSpec
from hpcmem.trace.pieces import chat_template, tokenizer

START, PAD, END = "<img>", "<imgpad>", "</img>"
MARKERS_PER_IMAGE = 2


def is_processor(proc: Any) -> bool:
    return proc.__class__.__name__ == "PPChart2TableProcessor"


def processor(job: JobSpec) -> Any:
    from transformers.models.pp_chart2table.image_processing_pil_pp_chart2table import PPChart2TableImageProcessorPil
    from transformers.models.pp_chart2table.processing_pp_chart2table import PPChart2TableProcessor

    v = job.model.vision
    tok = tokenizer()
    tok.add_special_tokens({"additional_special_tokens": [START, PAD, END]})
    images = PPChart2TableImageProcessorPil(size={"height": v.image_size, "width": v.image_size})
    return PPChart2TableProcessor(image_processor=images, tokenizer=tok,
                                  chat_template=chat_template(START + PAD * v.tokens_per_image + END))


def token_ids(proc: Any) -> dict[str, int]:
    """PPChart2TableConfig's image token id (`image_token_index`) in the processor's tokenizer."""
    return {"image_token_index": proc.tokenizer.convert_tokens_to_ids(PAD)}

"""The PaliGemma pieces of a vision-language SFT trace (hpcmem.trace.vision for the rest): the processor, its image
token and the tokens a row holds besides its images and words.

transformers 5.24 models/paligemma/processing_paligemma.py `PaliGemmaProcessor` around the PIL `SiglipImageProcessorPil`
(models/siglip/image_processing_pil_siglip.py: resize to image_size × image_size, no crop) with `image_seq_length`
(image_size / patch_size)², as the published preprocessor_config.json names it. The processor needs the tokenizer's
bos token (`prepare_inputs_layout` writes it after the last "<image>" and a "\\n" at the end, which the word
tokenizer drops: one token per row, `ROW_TOKENS`), adds 1,152 <locNNNN>/<segNNN> tokens, and returns token_type_ids
(all 0 without a suffix: the whole row is prefix to PaliGemmaModel's mask) and labels, which TRL's vision collator
replaces with input_ids. The chat template writes each image as "<image>" and the text as it is.
"""

from __future__ import annotations

from typing import Any

from hpcmem.job.jobspec import JobSpec
from hpcmem.trace.pieces import chat_template, tokenizer

IMAGE_TOKEN, BOS = "<image>", "<bos>"
MARKERS_PER_IMAGE = 0
ROW_TOKENS = 1              # the bos after the images
CHAT_TEMPLATE = chat_template(IMAGE_TOKEN)


def processor(job: JobSpec) -> Any:
    """PaliGemmaProcessor with the tower's image size and its image tokens (hpcmem.models.paligemma)."""
    from transformers.models.paligemma.processing_paligemma import PaliGemmaProcessor
    from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil

    v = job.model.vision
    tok = tokenizer()
    tok.add_special_tokens({"bos_token": BOS})
    images = SiglipImageProcessorPil(size={"height": v.image_size, "width": v.image_size})
    images.image_seq_length = v.tokens_per_image
    return PaliGemmaProcessor(image_processor=images, tokenizer=tok, chat_template=CHAT_TEMPLATE)


def token_ids(proc: Any) -> dict[str, int]:
    """PaliGemmaConfig's image token id (`image_token_index`) in the processor's tokenizer."""
    return {"image_token_index": proc.image_token_id}

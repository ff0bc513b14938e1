"""The LightOnOCR pieces of a vision-language trace (hpcmem.trace.vision for the rest): the processor and its image
token.

transformers 5.24 models/lighton_ocr/processing_lighton_ocr.py `LightOnOcrProcessor` (the processor transformers
pairs with lighton_ocr, models/auto/processing_auto.py) around the PIL `PixtralImageProcessorPil` (the image processor
models/auto/image_processing_auto.py pairs with it: fit to longest_edge, aspect kept, sides rounded up to its own
patch_size, padded to the batch's largest) with longest_edge the vision config's image_size and patch_size the
tower's (hpcmem.models.lighton_ocr). The processor reads its image, break and end tokens from the tokenizer's
attributes, which a checkpoint's tokenizer_config names (`extra_special_tokens`, set by
`_set_model_specific_special_tokens` as from_pretrained does); Qwen's `<|image_pad|>` is the image token.
`replace_image_token` expands each image token the chat template writes into the image's tokens, no markers besides.
"""

from __future__ import annotations

from typing import Any

from hpcmem.job.jobspec import JobSpec
from hpcmem.trace.pieces import chat_template, tokenizer

TOKENS = {"image_token": "<|image_pad|>", "image_break_token": "<|vision_pad|>", "image_end_token": "<|vision_end|>"}
MARKERS_PER_IMAGE = 0
CHAT_TEMPLATE = chat_template(TOKENS["image_token"])


def processor(job: JobSpec) -> Any:
    """LightOnOcrProcessor with the tower's longest_edge, patch size and merge size."""
    from transformers.models.lighton_ocr.processing_lighton_ocr import LightOnOcrProcessor
    from transformers.models.pixtral.image_processing_pil_pixtral import PixtralImageProcessorPil

    v = job.model.vision
    tok = tokenizer()
    tok.add_special_tokens({"additional_special_tokens": list(TOKENS.values())})
    tok._set_model_specific_special_tokens(TOKENS)
    images = PixtralImageProcessorPil(size={"longest_edge": v.image_size},
                                      patch_size={"height": v.patch_size, "width": v.patch_size})
    return LightOnOcrProcessor(image_processor=images, tokenizer=tok, patch_size=v.patch_size,
                               spatial_merge_size=v.spatial_merge_size, chat_template=CHAT_TEMPLATE)


def token_ids(proc: Any) -> dict[str, int]:
    """LightOnOcrConfig's image token id in the processor's tokenizer."""
    return {"image_token_id": proc.image_token_id}

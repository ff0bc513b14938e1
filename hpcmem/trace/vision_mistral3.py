"""The Mistral 3 pieces of a vision-language SFT trace (hpcmem.trace.vision for the rest): the processor and its image
tokens.

transformers 5.24 models/pixtral/processing_pixtral.py `PixtralProcessor` (the processor transformers pairs with
mistral3, models/auto/processing_auto.py) around the PIL `PixtralImageProcessorPil`
(image_processing_pil_pixtral.py: fit to longest_edge, aspect kept, sides rounded up to patch_size · merge, padded to
the batch's largest) with Mistral-Small-3.1's processor settings: longest_edge the vision config's image_size (1540),
patch_size 14, spatial_merge_size 2 (hpcmem.models.pixtral). `replace_image_token` expands each "[IMG]" the chat
template writes into rows of [IMG] tokens, an [IMG_BREAK] after each and [IMG_END] last: the image's tokens, no
markers besides.
"""

from __future__ import annotations

import sys
from typing import Any

from hpcmem.job.jobspec import JobSpec
from hpcmem.trace.pieces import chat_template, tokenizer

IMAGE_TOKEN, BREAK, END = "[IMG]", "[IMG_BREAK]", "[IMG_END]"
MARKERS_PER_IMAGE = 0       # the break and end tokens are counted with the image's (PixtralTowerSpec.image_tokens)
CHAT_TEMPLATE = chat_template(IMAGE_TOKEN)


def processor(job: JobSpec) -> Any:
    """PixtralProcessor with the tower's longest_edge, patch size and merge size."""
    from transformers.models.pixtral.image_processing_pil_pixtral import PixtralImageProcessorPil

    PixtralProcessor = processor_class()
    v = job.model.vision
    tok = tokenizer()
    tok.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN, BREAK, END]})
    images = PixtralImageProcessorPil(size={"longest_edge": v.image_size},
                                      patch_size={"height": v.patch_size, "width": v.patch_size})
    return PixtralProcessor(image_processor=images, tokenizer=tok, patch_size=v.patch_size,
                            spatial_merge_size=v.spatial_merge_size, chat_template=CHAT_TEMPLATE)


def processor_class() -> Any:
    """transformers' PixtralProcessor. Its module imports `get_resize_output_image_size` from the torchvision image
    processor's module (for `_get_num_multimodal_tokens` only, which training never calls); without torchvision that
    module is the PIL one, whose function is the same line for line."""
    try:
        from transformers.models.pixtral.processing_pixtral import PixtralProcessor
    except ModuleNotFoundError as err:
        if err.name != "torchvision":
            raise
        from transformers.models.pixtral import image_processing_pil_pixtral

        sys.modules["transformers.models.pixtral.image_processing_pixtral"] = image_processing_pil_pixtral
        from transformers.models.pixtral.processing_pixtral import PixtralProcessor
    return PixtralProcessor


def token_ids(proc: Any) -> dict[str, int]:
    """Mistral3Config's image token id (`image_token_id`, an alias of image_token_index) in the processor's
    tokenizer."""
    return {"image_token_id": proc.image_token_id}

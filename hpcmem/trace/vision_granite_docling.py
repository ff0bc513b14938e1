"""The Granite-Docling pieces of a vision-language trace (hpcmem.trace.vision for the rest): the processor, its image
tokens and the tokens around each image.

The processor is transformers' own `GraniteDoclingProcessor` (modular_granite_docling.py, Idefics3Processor's
subclass) around `GraniteDoclingImageProcessorPil` at its class defaults (512 px tiles, up to 32 and a thumbnail),
with image_seq_len the tower's tokens_per_tile (hpcmem.models.granite_docling). Its `replace_image_token` writes per
tile <fake_token_around_image><row_r_col_c> and tokens_per_tile <image>, a "\\n" after each row, and for a split image
"\\n", <fake_token_around_image><global-img>, the thumbnail's <image> tokens and <fake_token_around_image>. The word
tokenizer drops the newlines (whitespace), so an image of one tile takes 2 tokens besides its image tokens and one of
`tiles` (a thumbnail among them) 2 · (tiles − 1) + 3 (`markers`). The chat template writes each image as "<image>".
"""

from __future__ import annotations

from typing import Any

from hpcmem.job.images import image_geometry
from hpcmem.job.jobspec import JobSpec
from hpcmem.models.granite_docling import MAX_SIDE
from hpcmem.trace.pieces import chat_template, tokenizer

IMAGE, FAKE, GLOBAL = "<image>", "<fake_token_around_image>", "<global-img>"
# the processor's <row_i_col_j> tags, up to its 16 × 16 grid (`get_all_supported_aspect_ratios`)
ROW_COL = tuple(f"<row_{i}_col_{j}>" for i in range(1, MAX_SIDE + 1) for j in range(1, MAX_SIDE + 1))
CHAT_TEMPLATE = chat_template(IMAGE)


def processor(job: JobSpec) -> Any:
    from transformers.models.granite_docling.image_processing_pil_granite_docling import (
        GraniteDoclingImageProcessorPil)
    from transformers.models.granite_docling.processing_granite_docling import GraniteDoclingProcessor

    v = job.model.vision
    tok = tokenizer()
    tok.add_special_tokens({"additional_special_tokens": [FAKE, IMAGE, GLOBAL, *ROW_COL]})
    images = GraniteDoclingImageProcessorPil(size={"height": v.tile, "width": v.tile}, min_patches=v.min_patches,
                                             max_patches=v.max_patches)
    return GraniteDoclingProcessor(image_processor=images, tokenizer=tok, image_seq_len=v.tokens_per_tile,
                                   chat_template=CHAT_TEMPLATE)


def is_processor(proc: Any) -> bool:
    return proc.__class__.__name__ == "GraniteDoclingProcessor"


def token_ids(proc: Any) -> dict[str, int]:
    """GraniteDoclingConfig's image token id in the processor's tokenizer."""
    return {"image_token_id": proc.tokenizer.convert_tokens_to_ids(IMAGE)}


def markers(job: JobSpec) -> int:
    """Tokens around one image's image tokens: 2 per tile (fake token, row/col tag), and for a split image 3 for the
    thumbnail (fake token, global tag, fake token) in place of its 2."""
    tiles = image_geometry(job.train, job.model.vision).grid_thw[0]
    return 2 if tiles == 1 else 2 * (tiles - 1) + 3

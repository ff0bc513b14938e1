"""Gemma 3's processor for a vision-language trace: transformers' own `Gemma3Processor` around its PIL image processor
`Gemma3ImageProcessorPil` (the vision config's image_size square, pan-and-scan off as Gemma3Processor's
images_kwargs default it) and the word tokenizer with Gemma's three image tokens added.

Gemma3Processor (models/gemma3/processing_gemma3.py) reads `tokenizer.boi_token`, `eoi_token`, `image_token` and
their ids, replaces every boi_token in the text with "\\n\\n" + boi + mm_tokens_per_image image tokens + eoi +
"\\n\\n" (the word tokenizer splits on whitespace: 2 + mm_tokens_per_image tokens per image) and returns
`token_type_ids` (1 on image tokens: `return_mm_token_type_ids`), which TRL's vision collator passes on and
Gemma3Model turns into the bidirectional mask over each image's tokens. The chat template writes each image as the
boi token and the text as it is.
"""

from __future__ import annotations

from typing import Any

from hpcmem.job.jobspec import JobSpec
from hpcmem.trace.pieces import chat_template, tokenizer

BOI, EOI, IMAGE = "<start_of_image>", "<end_of_image>", "<image_soft_token>"     # Gemma 3's tokenizer's spellings
CHAT_TEMPLATE = chat_template(BOI)


def gemma3_tokenizer() -> Any:
    """The word tokenizer with boi, eoi and image token as named special tokens (ids after the words)."""
    tok = tokenizer()
    tok.add_special_tokens({"additional_special_tokens": [BOI, EOI, IMAGE]})
    for key, token in (("boi_token", BOI), ("eoi_token", EOI), ("image_token", IMAGE)):
        setattr(tok, key, token)
        setattr(tok, f"{key}_id", tok.convert_tokens_to_ids(token))
    return tok


def processor(job: JobSpec) -> Any:
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil
    from transformers.models.gemma3.processing_gemma3 import Gemma3Processor

    v = job.model.vision
    images = Gemma3ImageProcessorPil(size={"height": v.image_size, "width": v.image_size})
    return Gemma3Processor(image_processor=images, tokenizer=gemma3_tokenizer(), chat_template=CHAT_TEMPLATE,
                           image_seq_length=v.tokens_per_image)


def token_ids(proc: Any) -> dict[str, int]:
    """Gemma3Config's token-id keys and the processor tokenizer's ids."""
    tok = proc.tokenizer
    return {"image_token_index": tok.image_token_id, "boi_token_index": tok.boi_token_id,
            "eoi_token_index": tok.eoi_token_id}

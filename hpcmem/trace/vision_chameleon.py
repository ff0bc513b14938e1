"""The Chameleon pieces of a vision-language trace (hpcmem.trace.vision for the rest): the processor, the vocabulary
map the model reads its image ids from, and the tokens around each image.

transformers 5.24 models/chameleon/processing_chameleon.py `ChameleonProcessor` around the PIL
`ChameleonImageProcessorPil` (class defaults: the shortest edge resized to 512, the centre 512 × 512 kept) with
`image_seq_length` the VQ-VAE's codes per image (hpcmem.models.chameleon). The processor reads its image, begin- and
end-of-image tokens from the tokenizer's `image_token`, `boi_token` and `eoi_token` attributes (else "<image>",
"<racm3:break>", "<eoss>", the names of Chameleon's tokenizer): the word tokenizer gets those three added, and a sep
token, which `__call__` appends to every sample's text (return_for_text_completion False). `replace_image_token`
writes begin, image_seq_length `<image>` tokens and end: two markers per image, one sep per row. `__init__` takes no
chat template, so the trace sets the attribute after, as for Fuyu.

`ChameleonModel` reads the `<image>` id and the code → token map from the config's `vocabulary_map`
(`ChameleonImageVocabularyMapping`: names "IMGIMG" + the code's digits as the letters A–J + "Z"); the trace's map
holds the word tokenizer's `<image>` and one such name per codebook row, at ids after the tokenizer's own (Chameleon's
tokenizer holds its 8,192 image codes at ids 4 … 8195; where they lie changes no tensor's size).
"""

from __future__ import annotations

from typing import Any

from hpcmem.job.jobspec import JobSpec
from hpcmem.trace.pieces import chat_template, tokenizer

IMAGE_TOKEN, BOI, EOI, SEP = "<image>", "<racm3:break>", "<eoss>", "<reserved08706>"
MARKERS_PER_IMAGE = 2       # begin and end of each image
ROW_TOKENS = 1              # the sep token after each sample's text
CHAT_TEMPLATE = chat_template(IMAGE_TOKEN)


def processor(job: JobSpec) -> Any:
    from transformers.models.chameleon.image_processing_pil_chameleon import ChameleonImageProcessorPil
    from transformers.models.chameleon.processing_chameleon import ChameleonProcessor

    v = job.model.vision
    tok = tokenizer()
    tok.add_special_tokens({"sep_token": SEP, "additional_special_tokens": [IMAGE_TOKEN, BOI, EOI]})
    proc = ChameleonProcessor(image_processor=ChameleonImageProcessorPil(), tokenizer=tok,
                              image_seq_length=v.image_seq_length, image_token=IMAGE_TOKEN)
    proc.chat_template = CHAT_TEMPLATE
    proc.num_embeddings = v.num_embeddings      # read by `token_ids`
    return proc


def is_processor(proc: Any) -> bool:
    return proc.__class__.__name__ == "ChameleonProcessor"


def code_name(code: int) -> str:
    """The tokenizer's name of image code `code` (the inverse of ChameleonImageVocabularyMapping.bpe2img's remap)."""
    return "IMGIMG" + "".join(chr(ord("A") + int(d)) for d in str(code)) + "Z"


def token_ids(proc: Any) -> dict[str, Any]:
    """ChameleonConfig's vocabulary_map (the processor tokenizer's `<image>` and one token per codebook row) and the
    image_token_id its __post_init__ reads from it."""
    image = proc.tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    first = len(proc.tokenizer)
    vocab = {IMAGE_TOKEN: image, **{code_name(i): first + i for i in range(proc.num_embeddings)}}
    return {"vocabulary_map": vocab, "image_token_id": image}

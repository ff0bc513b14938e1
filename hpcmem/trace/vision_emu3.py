"""The Emu3 pieces of a vision-language trace (hpcmem.trace.vision for the rest): the processor, the config's
vocabulary map and the tokens around each image.

transformers 5.24 models/emu3/processing_emu3.py `Emu3Processor` reads its tokenizer's `image_token` (<image>, also the
placeholder the chat template writes for each image), `image_token_id`, `boi_token` (<|image start|>), `eoi_token`
(<|image end|>), `image_wrapper_token` (<|image token|>), `eof_token` (<|extra_201|>) and `bos_token`: the word
tokenizer gets those spellings (Emu3's tokenizer's; its bos <|extra_203|>) added as special tokens and set.
`replace_image_token` writes per image <|image start|>, "H*W" (the code grid's sides: one unknown word to the word
tokenizer, which splits on whitespace only — the real tokenizer spells it in several tokens; the trace fills its rows
to max_length with words whichever, `markers`), <|image token|>, H · (W + 1) <image>, <|extra_201|>, <|image end|>;
`prepare_inputs_layout` writes the bos before each text it is given (`ROW_TOKENS`: SFT's one text a row; DPO's prompt
and completion, each tokenized alone, `PREFERENCE_ROW_TOKENS`).

The image processor is transformers' own `Emu3ImageProcessor` (image_processing_emu3.py: numpy and PIL, no
torchvision), class defaults.

The model reads `config.vocabulary_map` (the tokenizer's vocabulary; `Emu3ImageVocabularyMapping`): `<image>`'s id
(the placeholder), `<|extra_200|>`'s (the row end appended to each code row) and the `<|visual token NNNNNN|>` ids the
codes map to. The stand-in map (`token_ids`) gives the first two the word tokenizer's ids and lays the codebook's ids at
the end of the text vocabulary, as Emu3-Chat's tokenizer does (its 32768 visual tokens are its last ids).
"""

from __future__ import annotations

from typing import Any

from hpcmem.job.jobspec import JobSpec
from hpcmem.trace.pieces import chat_template, tokenizer

IMAGE, BOI, EOI, WRAPPER, EOF, EOL, BOS = ("<image>", "<|image start|>", "<|image end|>", "<|image token|>",
                                           "<|extra_201|>", "<|extra_200|>", "<|extra_203|>")
MARKERS_PER_IMAGE = 5       # <|image start|>, "H*W", <|image token|>, <|extra_201|>, <|image end|>
ROW_TOKENS = 1              # the bos Emu3Processor.prepare_inputs_layout puts before an SFT row's text
PREFERENCE_ROW_TOKENS = 2   # before a DPO prompt and before its completion


def processor(job: JobSpec) -> Any:
    from transformers.models.emu3.image_processing_emu3 import Emu3ImageProcessor
    from transformers.models.emu3.processing_emu3 import Emu3Processor

    tok = tokenizer()
    tok.add_special_tokens({"additional_special_tokens": [IMAGE, BOI, EOI, WRAPPER, EOF, EOL, BOS]})
    tok.image_token, tok.boi_token, tok.eoi_token = IMAGE, BOI, EOI
    tok.image_wrapper_token, tok.eof_token, tok.bos_token = WRAPPER, EOF, BOS
    tok.image_token_id = tok.convert_tokens_to_ids(IMAGE)
    proc = Emu3Processor(image_processor=Emu3ImageProcessor(), tokenizer=tok, chat_template=chat_template(IMAGE))
    proc.codebook_size = job.model.vision.vq["codebook_size"]
    proc.vocab_size = job.model.vocab_size
    return proc


def is_processor(proc: Any) -> bool:
    return proc.__class__.__name__ == "Emu3Processor"


def token_ids(proc: Any) -> dict[str, Any]:
    """Emu3Config's `vocabulary_map` (the module docstring) and the image token id it derives from it."""
    image, eol = proc.tokenizer.convert_tokens_to_ids([IMAGE, EOL])
    first = proc.vocab_size - proc.codebook_size
    vocab = {IMAGE: image, EOL: eol, **{f"<|visual token {k:06d}|>": first + k for k in range(proc.codebook_size)}}
    return {"vocabulary_map": vocab, "image_token_id": image}

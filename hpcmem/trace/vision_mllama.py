"""The Llama-3.2-Vision pieces of a vision-language SFT trace (hpcmem.trace.vision for the rest): the processor and
its image token.

transformers 5.24 models/mllama/processing_mllama.py `MllamaProcessor` around the PIL `MllamaImageProcessorPil` with
the tower's tile (size image_size × image_size) and max_image_tiles (the vision config's max_num_tiles), as
meta-llama/Llama-3.2-11B-Vision-Instruct's preprocessor_config.json sets them (560, 4). The processor keeps each
"<|image|>" as one token (`replace_image_token` returns the token itself) and puts the tokenizer's BOS token in front
of each row's text (`build_string_from_input`: after any image tokens the row starts with), so a row holds its
images' tokens, one BOS token and its words; the cross-attention mask comes from the image tokens' positions. The
chat template writes each image as "<|image|>" and the text as it is.
"""

from __future__ import annotations

from typing import Any

from hpcmem.job.jobspec import JobSpec
from hpcmem.trace.pieces import chat_template, tokenizer

IMAGE, BOS, PYTHON = "<|image|>", "<|begin_of_text|>", "<|python_tag|>"
MARKERS_PER_IMAGE = 0
BOS_PER_ROW = 1
CHAT_TEMPLATE = chat_template(IMAGE)


def processor(job: JobSpec) -> Any:
    """MllamaProcessor with the tower's tile size and tile count (hpcmem.models.mllama.MllamaTowerSpec); the word
    tokenizer gains the image token, a BOS token (MllamaProcessor reads `tokenizer.bos_token`) and the python tag
    (MllamaProcessor.__init__ looks its id up)."""
    from transformers.models.mllama.image_processing_pil_mllama import MllamaImageProcessorPil
    from transformers.models.mllama.processing_mllama import MllamaProcessor

    v = job.model.vision
    tok = tokenizer()
    tok.add_special_tokens({"bos_token": BOS, "additional_special_tokens": [IMAGE, PYTHON]})
    images = MllamaImageProcessorPil(size={"height": v.image_size, "width": v.image_size},
                                     max_image_tiles=v.max_num_tiles)
    return MllamaProcessor(image_processor=images, tokenizer=tok, chat_template=CHAT_TEMPLATE)


def token_ids(proc: Any) -> dict[str, int]:
    """MllamaConfig's image token id (`image_token_id`, an alias of image_token_index) in the processor's tokenizer."""
    return {"image_token_id": proc.tokenizer.convert_tokens_to_ids(IMAGE)}

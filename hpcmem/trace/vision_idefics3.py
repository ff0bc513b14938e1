"""The SmolVLM / Idefics3 pieces of a vision-language SFT trace (hpcmem.trace.vision for the rest): the processor,
its image tokens and the tokens around each image.

The image processor is transformers' own PIL one of the model type (`SmolVLMImageProcessorPil`,
`Idefics3ImageProcessorPil`) with the tower's tile and longest edge (hpcmem.models.idefics3). The processor around it
is `Idefics3Processor` for both: `SmolVLMProcessor` needs the num2words package (its `__init__` raises without it)
and a video processor (torchvision), neither of which an image-only job uses, and its `replace_image_token` writes
the same text as Idefics3Processor's (models/smolvlm/processing_smolvlm.py `get_image_prompt_string`,
models/idefics3/processing_idefics3.py `Idefics3Processor.replace_image_token`): per local tile
<fake_token_around_image><row_r_col_c> and tokens_per_tile <image>, a "\\n" after each row, then "\\n", the global
tile's <fake_token_around_image><global-img>, its <image> tokens and <fake_token_around_image>; an unsplit image only
the global part. The word tokenizer drops the newlines (whitespace), so an image of `tiles` tiles takes
2 · tiles + 1 tokens besides its image tokens (`markers`). The chat template writes each image as "<image>" and the
text as it is.
"""

from __future__ import annotations

from typing import Any

from hpcmem.job.images import image_geometry
from hpcmem.job.jobspec import JobSpec
from hpcmem.trace.pieces import chat_template, tokenizer

IMAGE, FAKE, GLOBAL, END = "<image>", "<fake_token_around_image>", "<global-img>", "<end_of_utterance>"
ROW_COL = tuple(f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7))    # Idefics3Processor's 6 × 6
CHAT_TEMPLATE = chat_template(IMAGE)
IMAGE_PROCESSORS = {
    "smolvlm": ("transformers.models.smolvlm.image_processing_pil_smolvlm", "SmolVLMImageProcessorPil"),
    "idefics3": ("transformers.models.idefics3.image_processing_pil_idefics3", "Idefics3ImageProcessorPil")}


def processor(job: JobSpec) -> Any:
    import importlib

    from transformers.models.idefics3.processing_idefics3 import Idefics3Processor

    v = job.model.vision
    tok = tokenizer()
    tok.add_special_tokens({"additional_special_tokens": [FAKE, IMAGE, GLOBAL, END, *ROW_COL]})
    module, name = IMAGE_PROCESSORS[v.model_type]
    images = getattr(importlib.import_module(module), name)(size={"longest_edge": v.longest_edge},
                                                             max_image_size={"longest_edge": v.tile})
    return Idefics3Processor(image_processor=images, tokenizer=tok, image_seq_len=v.tokens_per_tile,
                             chat_template=CHAT_TEMPLATE)


def token_ids(proc: Any) -> dict[str, int]:
    """SmolVLMConfig's / Idefics3Config's image token id in the processor's tokenizer."""
    return {"image_token_id": proc.tokenizer.convert_tokens_to_ids(IMAGE)}


def markers(job: JobSpec) -> int:
    """Tokens around one image's image tokens: 2 per local tile (fake token, row/col tag) and 3 for the global tile."""
    tiles = image_geometry(job.train, job.model.vision).grid_thw[0]
    return 2 * tiles + 1

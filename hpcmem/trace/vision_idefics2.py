"""The Idefics2 pieces of a vision-language SFT trace (hpcmem.trace.vision for the rest): the processor, its image
token and the tokens a row holds besides its images and words.

transformers 5.24 models/idefics2/processing_idefics2.py `Idefics2Processor` around the PIL `Idefics2ImageProcessorPil`
with its class defaults (hpcmem.models.idefics2: no splitting) and `image_seq_len` the perceiver's latents. The
processor adds <fake_token_around_image>, <image> and <end_of_utterance> to the tokenizer and writes each image as
<fake_token_around_image>, image_seq_len <image> and <fake_token_around_image>, then drops the doubled fake token
between adjacent images (`sample.replace(fake + fake, fake)`): a row of k adjacent images holds k + 1 fake tokens, one
per image (`MARKERS_PER_IMAGE`) and one more per row (`ROW_TOKENS`). The chat template writes each image as "<image>"
and the text as it is.
"""

from __future__ import annotations

from typing import Any

from hpcmem.job.jobspec import JobSpec
from hpcmem.trace.pieces import chat_template, tokenizer

IMAGE = "<image>"
MARKERS_PER_IMAGE = 1
ROW_TOKENS = 1
CHAT_TEMPLATE = chat_template(IMAGE)


def processor(job: JobSpec) -> Any:
    """Idefics2Processor with the image processor's class defaults and the perceiver's latents as image_seq_len."""
    from transformers.models.idefics2.image_processing_pil_idefics2 import Idefics2ImageProcessorPil
    from transformers.models.idefics2.processing_idefics2 import Idefics2Processor

    v = job.model.vision
    images = Idefics2ImageProcessorPil(size={"shortest_edge": v.shortest_edge, "longest_edge": v.longest_edge})
    return Idefics2Processor(image_processor=images, tokenizer=tokenizer(), image_seq_len=v.tokens_per_image,
                             chat_template=CHAT_TEMPLATE)


def token_ids(proc: Any) -> dict[str, int]:
    """Idefics2Config's image token id in the processor's tokenizer."""
    return {"image_token_id": proc.image_token_id}

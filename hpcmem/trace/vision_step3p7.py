"""The Step 3.7 Flash pieces of a vision-language trace (hpcmem.trace.vision for the rest): the processor, its image
token and the tokens around each image.

transformers 5.24 models/step3p7/processing_step3p7.py `Step3p7Processor` fixes its image token to <im_patch> (also the
placeholder the chat template writes for each image) and reads its id from the tokenizer; `ProcessorMixin.__call__`
replaces each placeholder with `replace_image_token`'s string: per local crop <patch_start>, its (504 / 56)²
<im_patch> tokens and <patch_end>, a <patch_newline> after each crop row but the last, then <im_start>, the global
view's (728 / 56)² <im_patch> tokens and <im_end> (`markers`: hpcmem.models.step3p7 `Step3p7TowerSpec.markers`). The
word tokenizer gets those spellings added as special tokens, one token each. The model finds the image rows by
config.image_token_id (`get_placeholder_mask`), which the trace sets to <im_patch>'s id.

Its image processor, image_processing_step3p7.py `Step3p7ImageProcessor`, is a TorchvisionBackend with no PIL twin;
without torchvision only `resize` and `normalize` fail, which hpcmem.trace.torch_image_ops writes in torch; every crop
plan, slice and stack is the real class's own code (`pad`, for an extreme aspect ratio, stays torchvision's:
hpcmem.job.image_rules refuses such images).
"""

from __future__ import annotations

from typing import Any

from hpcmem.job.jobspec import JobSpec
from hpcmem.models.step3p7 import Step3p7TowerSpec
from hpcmem.trace.pieces import chat_template, tokenizer
from hpcmem.trace.torch_image_ops import torch_resize_normalize

IMAGE = "<im_patch>"
MARKERS = ("<patch_start>", "<patch_end>", "<patch_newline>", "<im_start>", "<im_end>")


def markers(job: JobSpec) -> int:
    v: Step3p7TowerSpec = job.model.vision
    return v.markers(job.train.image_height, job.train.image_width)


def _image_processor_class() -> type:
    """Step3p7ImageProcessor with torch's resize and normalize (hpcmem.trace.torch_image_ops)."""
    from transformers.models.step3p7.image_processing_step3p7 import Step3p7ImageProcessor

    return torch_resize_normalize(Step3p7ImageProcessor)


def processor(job: JobSpec) -> Any:
    from transformers.models.step3p7.processing_step3p7 import Step3p7Processor

    v: Step3p7TowerSpec = job.model.vision
    tok = tokenizer()
    tok.add_special_tokens({"additional_special_tokens": [IMAGE, *MARKERS]})
    images = _image_processor_class()(size={"height": v.image_size, "width": v.image_size}, patch_size=v.crop,
                                      max_image_size=v.max_image_size)
    return Step3p7Processor(image_processor=images, tokenizer=tok, chat_template=chat_template(IMAGE))


def is_processor(proc: Any) -> bool:
    return any(c.__name__ == "Step3p7Processor" for c in type(proc).__mro__)


def token_ids(proc: Any) -> dict[str, int]:
    """Step3p7Config's image_token_id: <im_patch>'s id in the processor's tokenizer."""
    return {"image_token_id": proc.image_token_id}

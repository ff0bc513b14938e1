"""The Molmo2 pieces of a vision-language trace (hpcmem.trace.vision for the rest): the processor, its token ids and
the tokens around each image.

transformers 5.24 models/molmo2/processing_molmo2.py `Molmo2Processor` reads its tokenizer's `image_token`
(<|image|>, also the placeholder the chat template writes for each image) and `video_token`, and the ids of
<im_patch>, <im_col>, <im_start>, <low_res_im_start>, <frame_start>, <im_end>, <frame_end> and <im_low>, which
`create_mm_token_type_ids` marks 1 in mm_token_type_ids (`return_mm_token_type_ids = True`); `replace_image_token`
writes each image as hpcmem.models.molmo2 `Molmo2TowerSpec.text_tokens` says (`markers`: those tokens less the
<im_patch> ones). Its `__call__` puts the tokenizer's bos token — the word tokenizer has none: its eos — before every
text it is given (`ROW_TOKENS`: SFT's one text a row; DPO's prompt and completion, each tokenized alone,
`PREFERENCE_ROW_TOKENS`). The word tokenizer gets those spellings added as special tokens.

Its image processor, image_processing_molmo2.py `Molmo2ImageProcessor`, is a TorchvisionBackend with no PIL twin;
without torchvision only `resize` and `normalize` fail, which hpcmem.trace.torch_image_ops writes in torch; every crop,
index grid and pooling index is the real class's own code. Its video processor needs torchvision, which an image-only
dataset never calls: left out (hpcmem.trace.vision_llava `without_video`).
"""

from __future__ import annotations

from typing import Any

from hpcmem.job.jobspec import JobSpec
from hpcmem.models.molmo2 import Molmo2TowerSpec
from hpcmem.trace.pieces import chat_template, tokenizer
from hpcmem.trace.torch_image_ops import torch_resize_normalize
from hpcmem.trace.vision_llava import without_video

IMAGE, VIDEO = "<|image|>", "<|video|>"
# Molmo2Processor.__init__'s `image_token_ids`, in its order
IMAGE_TOKENS = ("<im_patch>", "<im_col>", "<im_start>", "<low_res_im_start>", "<frame_start>", "<im_end>",
                "<frame_end>", "<im_low>")
ROW_TOKENS = 1              # the bos (here eos) Molmo2Processor.__call__ puts before an SFT row's text
PREFERENCE_ROW_TOKENS = 2   # before a DPO prompt and before its completion


def markers(job: JobSpec) -> int:
    """Tokens of one image besides its <im_patch> tokens: per view a start token, an <im_col> per pooled row, <im_end>."""
    v: Molmo2TowerSpec = job.model.vision
    h, w = job.train.image_height, job.train.image_width
    return v.text_tokens(h, w) - v.image_tokens(h, w)


def _image_processor_class() -> type:
    """Molmo2ImageProcessor with torch's resize and normalize (hpcmem.trace.torch_image_ops)."""
    from transformers.models.molmo2.image_processing_molmo2 import Molmo2ImageProcessor

    return torch_resize_normalize(Molmo2ImageProcessor)


def processor(job: JobSpec) -> Any:
    from transformers.models.molmo2.processing_molmo2 import Molmo2Processor

    v: Molmo2TowerSpec = job.model.vision
    tok = tokenizer()
    tok.add_special_tokens({"additional_special_tokens": [IMAGE, VIDEO, *IMAGE_TOKENS]})
    tok.image_token, tok.video_token = IMAGE, VIDEO
    images = _image_processor_class()(size={"height": v.image_size, "width": v.image_size},
                                      patch_size=v.patch_size, max_crops=v.max_crops,
                                      overlap_margins=list(v.overlap_margins), pooling_size=list(v.pooling))
    return without_video(Molmo2Processor)(image_processor=images, video_processor=None, tokenizer=tok,
                                          chat_template=chat_template(IMAGE))


def is_processor(proc: Any) -> bool:
    return any(c.__name__ == "Molmo2Processor" for c in type(proc).__mro__)


def token_ids(proc: Any) -> dict[str, int]:
    """Molmo2Config's token ids in the processor's tokenizer (`image_patch_id` is the one the model reads:
    `get_placeholder_mask`, through the `image_token_id` alias)."""
    ids = dict(zip(IMAGE_TOKENS, proc.tokenizer.convert_tokens_to_ids(list(IMAGE_TOKENS)), strict=True))
    return {"image_patch_id": ids["<im_patch>"], "image_start_token_id": ids["<im_start>"],
            "low_res_image_start_token_id": ids["<low_res_im_start>"], "image_end_token_id": ids["<im_end>"],
            "frame_start_token_id": ids["<frame_start>"], "frame_end_token_id": ids["<frame_end>"]}

"""The Apertus 1.5 pieces of a vision-language trace (hpcmem.trace.vision for the rest): the processor, its image
token and the tokens around each image.

transformers 5.24 models/apertus1p5/processing_apertus1p5.py `Apertus1p5Processor` reads its tokens off the tokenizer's
attributes (image_token, audio_token, boi_token, eoi_token, image_wrapper_token, eol_token, boa_token, eoa_token, which
an Apertus 1.5 checkpoint's tokenizer names; the spellings here are the trace's own, added to the word tokenizer as
special tokens). `replace_image_token` expands each image token the chat template writes into <boi>, the text
"{rows}*{cols}" (one unknown word to the word tokenizer), <image_wrapper>, rows of cols image tokens joined by <eol>,
<eoi>: rows + 3 tokens beside the codes' (`markers`).

Its image processor, image_processing_apertus1p5.py `Apertus1p5ImageProcessor`, is a TorchvisionBackend, and
transformers ships no PIL one. In its place `Apertus1p5ImageProcessorPil` here: the same arithmetic (hpcmem.models.
apertus1p5 `Apertus1p5TowerSpec.resized`: its smart_resize at spatial_factor 16 within the size bounds), PilBackend's
bicubic resize to that size (blank images either way), rescale and normalize with ImageNet's standard mean and std,
pixel_values [images, 3, height, width] (padded to the largest, here all alike) and image_sizes [[height, width]].
Its feature extractor (WavTokenizer's) is never called by an image-only dataset: left out (None), which the processor's
class check skips.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from hpcmem.job.images import pixel_bounds
from hpcmem.job.jobspec import JobSpec
from hpcmem.models.apertus1p5 import Apertus1p5TowerSpec
from hpcmem.trace.pieces import chat_template, tokenizer

TOKENS = {"image_token": "<|image|>", "audio_token": "<|audio|>", "boi_token": "<|begin_of_image|>",
          "eoi_token": "<|end_of_image|>", "image_wrapper_token": "<|image_wrapper|>", "eol_token": "<|eol|>",
          "boa_token": "<|begin_of_audio|>", "eoa_token": "<|end_of_audio|>"}
CHAT_TEMPLATE = chat_template(TOKENS["image_token"])


def markers(job: JobSpec) -> int:
    """Tokens beside one image's codes: <boi>, the "rows*cols" header (one word), <image_wrapper>, an <eol> between
    rows, <eoi>."""
    lo, hi = pixel_bounds(job.train, job.model.vision)
    rows, _ = job.model.vision.grid(job.train.image_height, job.train.image_width, lo, hi)
    return rows + 3


@lru_cache(maxsize=1)
def _image_processor_class() -> type:
    """Apertus1p5ImageProcessor's output made with PIL and numpy (the module docstring)."""
    import numpy as np
    from transformers.image_processing_backends import PilBackend
    from transformers.image_processing_utils import BatchFeature
    from transformers.image_utils import (IMAGENET_STANDARD_MEAN, IMAGENET_STANDARD_STD, PILImageResampling,
                                          SizeDict, make_flat_list_of_images)

    class Apertus1p5ImageProcessorPil(PilBackend):
        resample = PILImageResampling.BICUBIC
        image_mean, image_std = IMAGENET_STANDARD_MEAN, IMAGENET_STANDARD_STD
        model_input_names = ["pixel_values", "image_sizes"]

        def __init__(self, spec: Apertus1p5TowerSpec, lo: int, hi: int) -> None:
            super().__init__()
            self.spec, self.lo, self.hi = spec, lo, hi
            self.spatial_factor = spec.patch_size       # what Apertus1p5Processor reads of its image processor

        def preprocess(self, images: Any, return_tensors: Any = None, **kwargs: Any) -> Any:
            arrays, sizes = [], []
            for image in make_flat_list_of_images(images):
                array = np.asarray(image.convert("RGB"), dtype=np.float32).transpose(2, 0, 1)
                h, w = self.spec.resized(*array.shape[-2:], self.lo, self.hi)
                array = self.resize(array, SizeDict(height=h, width=w), resample=self.resample)
                arrays.append(self.normalize(self.rescale(array, 1 / 255), self.image_mean, self.image_std))
                sizes.append([h, w])
            mh, mw = max(s[0] for s in sizes), max(s[1] for s in sizes)
            padded = np.zeros((len(arrays), 3, mh, mw), dtype=np.float32)
            for i, array in enumerate(arrays):
                padded[i, :, :array.shape[1], :array.shape[2]] = array
            data = {"pixel_values": padded, "image_sizes": np.array(sizes, dtype=np.int64)}
            return BatchFeature(data=data, tensor_type=return_tensors)

    return Apertus1p5ImageProcessorPil


def _image_only(base: type) -> type:
    class ImageOnlyProcessor(base):  # type: ignore[misc,valid-type]
        def check_argument_for_proper_class(self, argument_name: str, argument: Any) -> Any:
            if argument_name == "feature_extractor" and argument is None:
                return None
            if argument_name == "image_processor" and argument.__class__.__name__ == "Apertus1p5ImageProcessorPil":
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    return ImageOnlyProcessor


def processor(job: JobSpec) -> Any:
    from transformers.models.apertus1p5.processing_apertus1p5 import Apertus1p5Processor

    v = job.model.vision
    lo, hi = pixel_bounds(job.train, v)
    tok = tokenizer()
    tok.add_special_tokens({"additional_special_tokens": list(TOKENS.values())})
    for attr, token in TOKENS.items():
        setattr(tok, attr, token)
    images = _image_processor_class()(v, lo, hi)
    return _image_only(Apertus1p5Processor)(image_processor=images, feature_extractor=None, tokenizer=tok,
                                            chat_template=CHAT_TEMPLATE)


def is_processor(proc: Any) -> bool:
    return any(c.__name__ == "Apertus1p5Processor" for c in type(proc).__mro__)


def token_ids(proc: Any) -> dict[str, int]:
    """Apertus1p5Config's image and audio token ids in the processor's tokenizer."""
    return {"image_token_id": proc.image_token_id, "audio_token_id": proc.audio_token_id}

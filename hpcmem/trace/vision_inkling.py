"""The Inkling pieces of a vision-language trace (hpcmem.trace.vision for the rest): the processor, its image token
and the tokens around each image (none).

transformers 5.24 models/inkling/processing_inkling.py `InklingProcessor` takes its tokenizer's `image_token`, or
"<|unused_200054|>", and reads the ids of it, of the audio token "<|unused_200053|>" and of the two span markers
"<|content_image|>" and "<|content_audio_input|>" from the tokenizer (each must be one token); `replace_image_token`
expands each image placeholder to num_patches image tokens, no markers. The word tokenizer gets the four spellings
added as special tokens; the processor gets the real `InklingFeatureExtractor` (numpy and torch only; no audio runs).
The model finds the image rows by config.image_token_id (`get_placeholder_mask`), which the trace sets to that
token's id.

Its image processor, image_processing_inkling.py `InklingImageProcessor`, is a TorchvisionBackend whose module imports
torchvision at its top, so without torchvision it cannot even be imported. In its place `InklingImageProcessorPil`
here, a stand-in with the same arithmetic (`_preprocess` with rescale_image_frac None, its class default: no resize;
`divide_to_patches`, written out again over numpy): each image as float RGB on the 0-255 scale cut into ⌈height / 40⌉
rows of width // 40 + 1 patches (hpcmem.models.inkling `InklingTowerSpec.grid`), each padded right and down to
40 × 40 with −1, rescaled by 1/255 and normalised with OpenAI CLIP's mean and std, repeated twice in time and laid
out [patches, 2, 40, 40, 3] (`[..., None].repeat(1, 1, 1, 1, 2)`, `permute(0, 4, 2, 3, 1)`), fp32, with num_patches
per image. Only the pixel values of an RGBA image's compositing differ (blank RGB images here); the shapes and dtypes
the model sees are the real class's.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from hpcmem.job.jobspec import JobSpec
from hpcmem.trace.pieces import chat_template, tokenizer

IMAGE = "<|unused_200054|>"
SPECIAL = (IMAGE, "<|unused_200053|>", "<|content_image|>", "<|content_audio_input|>")
MARKERS_PER_IMAGE = 0
FRAMES = 2          # `_preprocess`: each patch repeated twice in time


@lru_cache(maxsize=1)
def _image_processor_class() -> type:
    """InklingImageProcessor's output made with PIL and numpy (the module docstring)."""
    import numpy as np
    from transformers.image_processing_utils import BaseImageProcessor, BatchFeature
    from transformers.image_utils import make_flat_list_of_images
    from transformers.utils.constants import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD

    class InklingImageProcessorPil(BaseImageProcessor):
        model_input_names = ["pixel_values", "num_patches"]

        def __init__(self, patch: int) -> None:
            super().__init__()
            self.patch = patch
            self.size = {"height": patch, "width": patch}

        def preprocess(self, images: Any, return_tensors: Any = None, **kwargs: Any) -> Any:
            p = self.patch
            mean = np.array(OPENAI_CLIP_MEAN, dtype=np.float32)[:, None, None]
            std = np.array(OPENAI_CLIP_STD, dtype=np.float32)[:, None, None]
            values, counts = [], []
            for image in make_flat_list_of_images(images):
                array = np.asarray(image.convert("RGB"), dtype=np.float32).transpose(2, 0, 1)
                channels, height, width = array.shape
                rows, cols = (height + p - 1) // p, width // p + 1
                padded = np.full((channels, rows * p, cols * p), -1.0, dtype=np.float32)
                padded[:, :height, :width] = array
                padded = (padded / 255.0 - mean) / std
                patches = padded.reshape(channels, rows, p, cols, p).transpose(1, 3, 0, 2, 4) \
                    .reshape(rows * cols, channels, p, p)
                values.append(np.repeat(patches[..., None], FRAMES, axis=-1))
                counts.append(rows * cols)
            pixel_values = np.concatenate(values).transpose(0, 4, 2, 3, 1).astype(np.float32)
            data = {"pixel_values": np.ascontiguousarray(pixel_values), "num_patches": np.array(counts)}
            return BatchFeature(data=data, tensor_type=return_tensors)

        def __call__(self, images: Any, **kwargs: Any) -> Any:
            return self.preprocess(images, **kwargs)

    return InklingImageProcessorPil


def processor(job: JobSpec) -> Any:
    from transformers.models.inkling.feature_extraction_inkling import InklingFeatureExtractor
    from transformers.models.inkling.processing_inkling import InklingProcessor

    class StandInProcessor(InklingProcessor):
        def check_argument_for_proper_class(self, argument_name: str, argument: Any) -> Any:
            if argument_name == "image_processor" and argument.__class__.__name__ == "InklingImageProcessorPil":
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    tok = tokenizer()
    tok.add_special_tokens({"additional_special_tokens": list(SPECIAL)})
    images = _image_processor_class()(job.model.vision.cell)
    return StandInProcessor(feature_extractor=InklingFeatureExtractor(), image_processor=images, tokenizer=tok,
                            chat_template=chat_template(IMAGE))


def is_processor(proc: Any) -> bool:
    return any(c.__name__ == "InklingProcessor" for c in type(proc).__mro__)


def token_ids(proc: Any) -> dict[str, int]:
    """InklingConfig's image_token_id: the image token's id in the processor's tokenizer."""
    return {"image_token_id": proc.image_token_id}

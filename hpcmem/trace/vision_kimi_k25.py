"""The Kimi K2.5 pieces of a vision-language trace (hpcmem.trace.vision for the rest): the processor, its image token
and the tokens around each image.

transformers 5.24 models/kimi_k25/processing_kimi_k25.py `Kimi_K25Processor` reads its tokenizer's `image_token`
(<|media_pad|>, also the placeholder the chat template writes for each image) and `video_token`, and their ids, in
`__init__`; `replace_image_token` expands each placeholder to grid_thw.prod() / merge_size² image tokens. The chat
template writes nothing else around an image here (the published one's <|media_begin|>image<|media_content|> …
<|media_end|> are plain text tokens to the model): `MARKERS_PER_IMAGE` 0. The word tokenizer gets both spellings added
as special tokens.

Its image processor, image_processing_kimi_k25.py `Kimi_K25ImageProcessor`, is torchvision's only, and transformers
ships no PIL one. In its place `Kimi_K25ImageProcessorPil` here: the same arithmetic (hpcmem.models.kimi_k25
`kimi_k25_grid`: `navit_resize`, never upscaling, each side padded up to a multiple of merge · patch), PilBackend's
bicubic resize (blank images either way), zero padding at the bottom and right (`pad`), rescale and normalize, and
`patchify`'s layout: pixel_values [patches, 3, patch, patch] in rows then columns, image_grid_thw [1, rows, columns].
Its video processor needs torchvision, which an image-only dataset never calls: left out (None), which the
processor's class check skips.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from hpcmem.job.jobspec import JobSpec
from hpcmem.models.kimi_k25 import MERGE, KimiK25TowerSpec
from hpcmem.trace.pieces import chat_template, tokenizer

IMAGE, VIDEO = "<|media_pad|>", "<|kimi_k25_video_placeholder|>"
MARKERS_PER_IMAGE = 0


@lru_cache(maxsize=1)
def _image_processor_class() -> type:
    """Kimi_K25ImageProcessor's output made with PIL and numpy (the module docstring)."""
    import numpy as np
    from transformers.image_processing_backends import PilBackend
    from transformers.image_processing_utils import BatchFeature
    from transformers.image_utils import (IMAGENET_STANDARD_MEAN, IMAGENET_STANDARD_STD, PILImageResampling,
                                          SizeDict, make_flat_list_of_images)

    class Kimi_K25ImageProcessorPil(PilBackend):
        resample = PILImageResampling.BICUBIC
        image_mean, image_std = IMAGENET_STANDARD_MEAN, IMAGENET_STANDARD_STD
        model_input_names = ["pixel_values", "image_grid_thw"]

        def __init__(self, spec: KimiK25TowerSpec) -> None:
            super().__init__()
            self.spec = spec
            # the attributes Kimi_K25Processor reads of its image processor
            self.patch_size, self.merge_size, self.max_patches = spec.patch_size, MERGE, spec.max_patches

        def preprocess(self, images: Any, return_tensors: Any = None, **kwargs: Any) -> Any:
            v, p = self.spec, self.spec.patch_size
            values, grids = [], []
            for image in make_flat_list_of_images(images):
                array = np.asarray(image.convert("RGB"), dtype=np.float32).transpose(2, 0, 1)
                height, width = array.shape[-2:]
                rows, cols = v.grid(height, width)
                ph, pw = p * v.max_size_per_side, p * v.max_size_per_side
                # navit_resize's resized size: the padded one less its padding (the image itself when not scaled)
                scale = min(1.0, (v.max_patches / (max(1, height // p) * max(1, width // p))) ** 0.5,
                            ph / height, pw / width)
                h, w = min(max(1, int(height * scale)), ph), min(max(1, int(width * scale)), pw)
                if (h, w) != (height, width):
                    array = self.resize(array, SizeDict(height=h, width=w), resample=self.resample)
                padded = np.zeros((3, rows * p, cols * p), dtype=np.float32)
                padded[:, :h, :w] = array
                padded = self.normalize(self.rescale(padded, 1 / 255), self.image_mean, self.image_std)
                patches = padded.reshape(3, rows, p, cols, p).transpose(1, 3, 0, 2, 4).reshape(rows * cols, 3, p, p)
                values.append(patches.astype(np.float32))
                grids.append([1, rows, cols])
            data = {"pixel_values": np.concatenate(values), "image_grid_thw": np.array(grids, dtype=np.int64)}
            return BatchFeature(data=data, tensor_type=return_tensors)

    return Kimi_K25ImageProcessorPil


def processor(job: JobSpec) -> Any:
    from transformers.models.kimi_k25.processing_kimi_k25 import Kimi_K25Processor

    class ImageOnlyProcessor(Kimi_K25Processor):
        def check_argument_for_proper_class(self, argument_name: str, argument: Any) -> Any:
            if argument_name == "video_processor" and argument is None:
                return None
            if argument_name == "image_processor" and argument.__class__.__name__ == "Kimi_K25ImageProcessorPil":
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    tok = tokenizer()
    tok.add_special_tokens({"additional_special_tokens": [IMAGE, VIDEO]})
    return ImageOnlyProcessor(image_processor=_image_processor_class()(job.model.vision), tokenizer=tok,
                              video_processor=None, chat_template=chat_template(IMAGE))


def is_processor(proc: Any) -> bool:
    return isinstance(getattr(proc, "image_token", None), str) and proc.image_token == IMAGE


def token_ids(proc: Any) -> dict[str, int]:
    """Kimi_K25Config's image and video token ids in the processor's tokenizer."""
    return {"image_token_id": proc.image_token_id, "video_token_id": proc.video_token_id}

"""The Inkling 2 pieces of a vision-language trace (hpcmem.trace.vision for the rest): the processor, its image token
and the tokens around each image (none).

transformers 5.24 models/inkling2/processing_inkling2.py `Inkling2Processor` takes its tokenizer's `image_token`, or
"<|unused_200054|>" (also the placeholder the chat template writes for each image), and reads its id from the
tokenizer; `replace_image_token` expands each placeholder to image_grid_thw.prod() image tokens, no markers. The word
tokenizer gets the spelling added as a special token. The model finds the image rows by config.image_token_id
(`get_placeholder_mask`), which the trace sets to that token's id.

Its image processor, image_processing_inkling2.py `Inkling2ImageProcessor`, is a TorchvisionBackend whose module
imports torchvision at its top, so without torchvision it cannot even be imported. In its place
`Inkling2ImageProcessorPil` here, a stand-in with the same arithmetic (`_preprocess`, written out again over numpy):
each image as float RGB on the 0-255 scale padded right and down to whole 40 px cells (rows = ⌈height / 40⌉, columns =
⌈width / 40⌉, hpcmem.models.inkling2 `inkling2_grid`) with −1, rescaled by 1/255 and normalised with mean and std 0.5,
cut into one [40, 40, 3] row of pixel_values per cell (`reshape(channels, rows, 40, columns, 40).permute(1, 3, 2, 4,
0)`), fp32, and image_grid_thw [1, rows, columns]. Only the pixel values of an RGBA image's checkerboard compositing
differ (blank RGB images here); the shapes and dtypes the model sees are the real class's.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from hpcmem.job.jobspec import JobSpec
from hpcmem.models.inkling2 import inkling2_grid
from hpcmem.trace.pieces import chat_template, tokenizer

IMAGE = "<|unused_200054|>"
MARKERS_PER_IMAGE = 0


@lru_cache(maxsize=1)
def _image_processor_class() -> type:
    """Inkling2ImageProcessor's output made with PIL and numpy (the module docstring)."""
    import numpy as np
    from transformers.image_processing_utils import BaseImageProcessor, BatchFeature
    from transformers.image_utils import make_flat_list_of_images

    class Inkling2ImageProcessorPil(BaseImageProcessor):
        model_input_names = ["pixel_values", "image_grid_thw"]

        def __init__(self, cell: int) -> None:
            super().__init__()
            self.cell = cell
            self.size = {"height": cell, "width": cell}

        def preprocess(self, images: Any, return_tensors: Any = None, **kwargs: Any) -> Any:
            c = self.cell
            values, grids = [], []
            for image in make_flat_list_of_images(images):
                array = np.asarray(image.convert("RGB"), dtype=np.float32).transpose(2, 0, 1)
                channels, height, width = array.shape
                rows, cols = inkling2_grid(height, width, c)
                padded = np.full((channels, rows * c, cols * c), -1.0, dtype=np.float32)
                padded[:, :height, :width] = array
                padded = (padded / 255.0 - 0.5) / 0.5
                values.append(padded.reshape(channels, rows, c, cols, c).transpose(1, 3, 2, 4, 0)
                              .reshape(rows * cols, c, c, channels))
                grids.append([1, rows, cols])
            data = {"pixel_values": np.concatenate(values).astype(np.float32),
                    "image_grid_thw": np.array(grids, dtype=np.int64)}
            return BatchFeature(data=data, tensor_type=return_tensors)

        def __call__(self, images: Any, **kwargs: Any) -> Any:
            return self.preprocess(images, **kwargs)

    return Inkling2ImageProcessorPil


def processor(job: JobSpec) -> Any:
    from transformers.models.inkling2.processing_inkling2 import Inkling2Processor

    class StandInProcessor(Inkling2Processor):
        def check_argument_for_proper_class(self, argument_name: str, argument: Any) -> Any:
            if argument_name == "image_processor" and argument.__class__.__name__ == "Inkling2ImageProcessorPil":
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    tok = tokenizer()
    tok.add_special_tokens({"additional_special_tokens": [IMAGE]})
    images = _image_processor_class()(job.model.vision.cell)
    return StandInProcessor(image_processor=images, tokenizer=tok, chat_template=chat_template(IMAGE))


def is_processor(proc: Any) -> bool:
    return any(c.__name__ == "Inkling2Processor" for c in type(proc).__mro__)


def token_ids(proc: Any) -> dict[str, int]:
    """Inkling2Config's image_token_id: the image token's id in the processor's tokenizer."""
    return {"image_token_id": proc.image_token_id}

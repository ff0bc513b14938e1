"""The Muse Glimmer pieces of a vision-language trace (hpcmem.trace.vision for the rest): the processor, its image
token and the tokens around each image.

transformers 5.24 models/muse_glimmer/processing_muse_glimmer.py `MuseGlimmerProcessor` reads its tokenizer's ids of
<|patch|> (the image token, also the placeholder the chat template writes for each image), <|image_start|>,
<|image_end|> and <|video|> in `__init__` (processing_muse_spark.py `MuseSparkProcessor`: the same spellings,
where its tokenizer names none, and <|audio|>); `replace_image_token` expands each placeholder to <|image_start|>, then
grid_thw.prod() / merge_size² image tokens, then <|image_end|>: `MARKERS_PER_IMAGE` 2. The word tokenizer gets the
spellings added as special tokens.

Its image processor, image_processing_muse_glimmer.py `MuseGlimmerImageProcessor`, is torchvision's only, and
transformers ships no PIL one. In its place `MuseGlimmerImageProcessorPil` here: the same arithmetic
(hpcmem.models.muse_glimmer `MuseGlimmerTowerSpec.grid`: `smart_resize`'s grid of patch · merge blocks), PilBackend's
Lanczos resize to that size (blank images either way), rescale and normalize with ImageNet's standard mean and std,
and `patchify`'s layout: each patch repeated temporal_patch_size times, flattened (temporal, channel, row, column)
into pixel_values [patches, temporal_patch_size · 3 · patch²] in rows then columns, image_grid_thw [1, rows,
columns]. Its video processor needs torchvision, which an image-only dataset never calls: left out (None), which the
processor's class check skips.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from hpcmem.job.jobspec import JobSpec
from hpcmem.models.muse_glimmer import MuseGlimmerTowerSpec
from hpcmem.trace.pieces import chat_template, tokenizer

IMAGE, IMAGE_START, IMAGE_END, VIDEO = "<|patch|>", "<|image_start|>", "<|image_end|>", "<|video|>"
AUDIO = "<|audio|>"         # MuseSparkProcessor's audio token
MARKERS_PER_IMAGE = 2


@lru_cache(maxsize=1)
def _image_processor_class() -> type:
    """MuseGlimmerImageProcessor's output made with PIL and numpy (the module docstring)."""
    import numpy as np
    from transformers.image_processing_backends import PilBackend
    from transformers.image_processing_utils import BatchFeature
    from transformers.image_utils import (IMAGENET_STANDARD_MEAN, IMAGENET_STANDARD_STD, PILImageResampling,
                                          SizeDict, make_flat_list_of_images)

    class MuseGlimmerImageProcessorPil(PilBackend):
        resample = PILImageResampling.LANCZOS
        image_mean, image_std = IMAGENET_STANDARD_MEAN, IMAGENET_STANDARD_STD
        model_input_names = ["pixel_values", "image_grid_thw"]

        def __init__(self, spec: MuseGlimmerTowerSpec) -> None:
            super().__init__()
            self.spec = spec
            # the attributes MuseGlimmerProcessor reads of its image processor
            self.patch_size, self.merge_size = spec.patch_size, spec.merge_size
            self.temporal_patch_size, self.max_image_tokens = spec.patch_temporal, spec.max_image_tokens

        def preprocess(self, images: Any, return_tensors: Any = None, **kwargs: Any) -> Any:
            v, p, t = self.spec, self.spec.patch_size, self.spec.patch_temporal
            values, grids = [], []
            for image in make_flat_list_of_images(images):
                array = np.asarray(image.convert("RGB"), dtype=np.float32).transpose(2, 0, 1)
                rows, cols = v.grid(*array.shape[-2:])
                array = self.resize(array, SizeDict(height=rows * p, width=cols * p), resample=self.resample)
                array = self.normalize(self.rescale(array, 1 / 255), self.image_mean, self.image_std)
                patches = array.reshape(3, rows, p, cols, p).transpose(1, 3, 0, 2, 4).reshape(rows * cols, 1, 3, p, p)
                values.append(np.repeat(patches, t, axis=1).reshape(rows * cols, t * 3 * p * p).astype(np.float32))
                grids.append([1, rows, cols])
            data = {"pixel_values": np.concatenate(values), "image_grid_thw": np.array(grids, dtype=np.int64)}
            return BatchFeature(data=data, tensor_type=return_tensors)

    return MuseGlimmerImageProcessorPil


def _image_only(base: type) -> type:
    class ImageOnlyProcessor(base):  # type: ignore[misc,valid-type]
        def check_argument_for_proper_class(self, argument_name: str, argument: Any) -> Any:
            if argument_name == "video_processor" and argument is None:
                return None
            if argument_name == "image_processor" and argument.__class__.__name__ == "MuseGlimmerImageProcessorPil":
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    return ImageOnlyProcessor


def processor(job: JobSpec) -> Any:
    """MuseGlimmerProcessor; Muse Spark's `MuseSparkProcessor` (processing_muse_spark.py: Muse Glimmer's with an
    audio token and transformers' own `MuseSparkFeatureExtractor`, which an image-only dataset never calls)."""
    tok = tokenizer()
    images = _image_processor_class()(job.model.vision)
    if job.model.vision.model_type == "muse_spark":
        from transformers.models.muse_spark.feature_extraction_muse_spark import MuseSparkFeatureExtractor
        from transformers.models.muse_spark.processing_muse_spark import MuseSparkProcessor

        tok.add_special_tokens({"additional_special_tokens": [IMAGE, IMAGE_START, IMAGE_END, VIDEO, AUDIO]})
        return _image_only(MuseSparkProcessor)(image_processor=images, tokenizer=tok, video_processor=None,
                                               feature_extractor=MuseSparkFeatureExtractor(),
                                               chat_template=chat_template(IMAGE))
    from transformers.models.muse_glimmer.processing_muse_glimmer import MuseGlimmerProcessor

    tok.add_special_tokens({"additional_special_tokens": [IMAGE, IMAGE_START, IMAGE_END, VIDEO]})
    return _image_only(MuseGlimmerProcessor)(image_processor=images, tokenizer=tok, video_processor=None,
                                             chat_template=chat_template(IMAGE))


def is_processor(proc: Any) -> bool:
    return isinstance(getattr(proc, "image_token", None), str) and proc.image_token == IMAGE


def token_ids(proc: Any) -> dict[str, int]:
    """MuseGlimmerConfig's image and video token ids in the processor's tokenizer; MuseSparkConfig's audio token id
    too (MuseSparkModel.forward zeroes the audio token's ids before the embedding, so no text token may take it)."""
    ids = {"image_token_id": proc.image_token_id, "video_token_id": proc.video_token_id}
    if getattr(proc, "audio_token_id", None) is not None:
        ids["audio_token_id"] = proc.audio_token_id
    return ids

"""The LFM2-VL pieces of a vision-language SFT trace (hpcmem.trace.vision for the rest): the processor, its image
token and the tokens around each image.

transformers 5.24 models/lfm2_vl/processing_lfm2_vl.py `Lfm2VlProcessor` reads the tokenizer's `image_token`
(<image>, also the placeholder the chat template writes for each image), `image_token_id`, `image_start_token`,
`image_end_token` and `image_thumbnail_token`; `_build_image_tokens` writes <|image_start|>, per tile
<|img_row_r_col_c|> and its image tokens, <|img_thumbnail|> and the thumbnail's tokens (a lone image: its tokens),
<|image_end|> (`markers`). The word tokenizer gets those spellings added as special tokens and set.

Its image processor, image_processing_lfm2_vl.py `Lfm2VlImageProcessor`, is torchvision's only, and transformers
ships no PIL one. In its place `Lfm2VlImageProcessorPil` here: the same arithmetic (hpcmem.models.lfm2_vl
`lfm2_vl_tiles`: `smart_resize`, `_is_image_too_large`, `_get_grid_layout`; tests/trace hold it equal to the real
methods over many sizes), PilBackend's bilinear resize in place of torchvision's antialiased one (blank images
either way), the tiles cut from the resized canvas in rows then columns (`split_to_tiles`), the thumbnail after them,
and Siglip2ImageProcessorPil's `convert_image_to_patches` and `pad_along_first_dim` (the same patch order as the
torchvision `convert_image_to_patches`: rows, columns, pixel row, pixel column, channel). It returns pixel_values
[tiles, max_num_patches, 3 · patch²], pixel_attention_mask, spatial_shapes and the image_rows, image_cols and
image_sizes the processor reads for the tokens.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from hpcmem.job.jobspec import JobSpec
from hpcmem.models.lfm2_vl import Lfm2VlTowerSpec
from hpcmem.trace.pieces import chat_template, tokenizer

IMAGE, START, END, THUMBNAIL = "<image>", "<|image_start|>", "<|image_end|>", "<|img_thumbnail|>"


def markers(job: JobSpec) -> int:
    """Tokens around one image's image tokens: start and end, and with several tiles one <|img_row_r_col_c|> per tile
    and <|img_thumbnail|> (use_thumbnail)."""
    v: Lfm2VlTowerSpec = job.model.vision
    cols, rows, _ = v.layout(job.train.image_height, job.train.image_width)
    return 2 + (0 if cols * rows == 1 else cols * rows + (1 if v.use_thumbnail else 0))


@lru_cache(maxsize=1)
def _image_processor_class() -> type:
    """Lfm2VlImageProcessor's output made with PIL and numpy (the module docstring)."""
    import numpy as np
    from transformers.image_processing_backends import PilBackend
    from transformers.image_processing_utils import BatchFeature
    from transformers.image_utils import (IMAGENET_STANDARD_MEAN, IMAGENET_STANDARD_STD, PILImageResampling,
                                          SizeDict, make_flat_list_of_images)
    from transformers.processing_utils import ImagesKwargs
    from transformers.models.siglip2.image_processing_pil_siglip2 import (convert_image_to_patches,
                                                                          pad_along_first_dim)

    class Lfm2VlImageProcessorKwargs(ImagesKwargs, total=False):
        """image_processing_lfm2_vl.py `Lfm2VlImageProcessorKwargs`'s keys (the processor merges its images_kwargs,
        return_row_col_info among them, against these)."""

        downsample_factor: int
        do_image_splitting: bool
        min_tiles: int
        max_tiles: int
        use_thumbnail: bool
        min_image_tokens: int
        max_image_tokens: int
        encoder_patch_size: int
        tile_size: int
        max_pixels_tolerance: float
        do_pad: bool
        return_row_col_info: bool

    class Lfm2VlImageProcessorPil(PilBackend):
        valid_kwargs = Lfm2VlImageProcessorKwargs
        resample = PILImageResampling.BILINEAR
        image_mean, image_std = IMAGENET_STANDARD_MEAN, IMAGENET_STANDARD_STD
        model_input_names = ["pixel_values", "pixel_attention_mask", "spatial_shapes"]

        def __init__(self, spec: Lfm2VlTowerSpec) -> None:
            super().__init__()
            self.spec = spec
            # the attributes Lfm2VlProcessor reads of its image processor
            self.tile_size, self.downsample_factor = spec.tile, spec.scale_factor
            self.encoder_patch_size, self.use_thumbnail = spec.patch_size, spec.use_thumbnail

        def preprocess(self, images: Any, return_tensors: Any = None, **kwargs: Any) -> Any:
            v, p = self.spec, self.spec.patch_size
            values, masks, shapes, rows_out, cols_out, sizes = [], [], [], [], [], []
            for image in make_flat_list_of_images(images):
                array = np.asarray(image.convert("RGB"), dtype=np.float32).transpose(2, 0, 1)
                height, width = array.shape[-2:]
                cols, rows, (h, w) = v.layout(height, width)
                if cols * rows == 1:
                    crops = [self.resize(array, SizeDict(height=h, width=w), resample=self.resample)]
                else:
                    t = v.tile
                    canvas = self.resize(array, SizeDict(height=rows * t, width=cols * t), resample=self.resample)
                    crops = [canvas[:, r * t:(r + 1) * t, c * t:(c + 1) * t] for r in range(rows)
                             for c in range(cols)]
                    if v.use_thumbnail:
                        crops.append(self.resize(array, SizeDict(height=h, width=w), resample=self.resample))
                for crop in crops:
                    crop = self.normalize(self.rescale(crop, 1 / 255), self.image_mean, self.image_std)
                    patches, mask = pad_along_first_dim(convert_image_to_patches(crop, p), v.patches)
                    values.append(patches.astype(np.float32))
                    masks.append(mask)
                    shapes.append((crop.shape[-2] // p, crop.shape[-1] // p))
                rows_out.append(rows)
                cols_out.append(cols)
                sizes.append([h, w])
            data = {"pixel_values": np.stack(values), "pixel_attention_mask": np.stack(masks),
                    "spatial_shapes": np.array(shapes, dtype=np.int64)}
            out = BatchFeature(data=data, tensor_type=return_tensors)
            out.update({"image_rows": rows_out, "image_cols": cols_out, "image_sizes": sizes})
            return out

    return Lfm2VlImageProcessorPil


def processor(job: JobSpec) -> Any:
    from transformers.models.lfm2_vl.processing_lfm2_vl import Lfm2VlProcessor

    v: Lfm2VlTowerSpec = job.model.vision
    tok = tokenizer()
    grid = [f"<|img_row_{r}_col_{c}|>" for r in range(1, v.max_tiles + 1) for c in range(1, v.max_tiles + 1)]
    tok.add_special_tokens({"additional_special_tokens": [IMAGE, START, END, THUMBNAIL, *grid]})
    for key, token in (("image_token", IMAGE), ("image_start_token", START), ("image_end_token", END),
                       ("image_thumbnail_token", THUMBNAIL)):
        setattr(tok, key, token)
    tok.image_token_id = tok.convert_tokens_to_ids(IMAGE)
    return Lfm2VlProcessor(image_processor=_image_processor_class()(v), tokenizer=tok, chat_template=chat_template(IMAGE))


def is_processor(proc: Any) -> bool:
    return proc.__class__.__name__ == "Lfm2VlProcessor"


def token_ids(proc: Any) -> dict[str, int]:
    """Lfm2VlConfig's image token id (`image_token_id`) in the processor's tokenizer."""
    return {"image_token_id": proc.image_token_id}


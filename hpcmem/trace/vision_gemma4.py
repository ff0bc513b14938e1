"""The Gemma 4 pieces of a vision-language SFT trace (hpcmem.trace.vision for the rest): the processor, its image
token and the tokens around each image.

transformers 5.24 models/gemma4/processing_gemma4.py `Gemma4Processor` around the PIL `Gemma4ImageProcessorPil`
(patch_size, pooling_kernel_size and max_soft_tokens of the spec: hpcmem.models.gemma4), its audio feature extractor
(`Gemma4AudioFeatureExtractor`, numpy only; an image-only dataset never calls it) and no video processor (it needs
torchvision: hpcmem.trace.vision_llava `without_video`). It reads the tokenizer's `image_token`, `boi_token`,
`eoi_token`, `image_token_id` and, in `validate_inputs`, `boa_token` and `eoa_token`: the word tokenizer gets them
added as special tokens and set. `replace_image_token` writes boi, the image's `num_soft_tokens_per_image` image
tokens and eoi (`MARKERS_PER_IMAGE`), and the processor returns `mm_token_type_ids`, `image_position_ids` and
`num_soft_tokens_per_image` beside pixel_values; TRL's vision collator hands them all to the model, whose forward
reads image_position_ids and takes the rest into its kwargs. The chat template writes each image as the image token.
"""

from __future__ import annotations

from typing import Any

from hpcmem.job.jobspec import JobSpec
from hpcmem.trace.pieces import chat_template, tokenizer
from hpcmem.trace.vision_llava import without_video

# Gemma 4's tokenizer's spellings (its chat template's image placeholder is <|image|>)
IMAGE, BOI, EOI, BOA, EOA, AUDIO = "<|image|>", "<|image>", "<image|>", "<|audio>", "<audio|>", "<|audio|>"
MARKERS_PER_IMAGE = 2       # boi and eoi around each image's soft tokens


def processor(job: JobSpec) -> Any:
    from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor
    from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil
    from transformers.models.gemma4.processing_gemma4 import Gemma4Processor

    v = job.model.vision
    tok = _tokenizer()
    images = Gemma4ImageProcessorPil(patch_size=v.patch_size, pooling_kernel_size=v.pooling_kernel_size,
                                     max_soft_tokens=v.max_soft_tokens)
    return without_video(Gemma4Processor)(feature_extractor=Gemma4AudioFeatureExtractor(), image_processor=images,
                                          tokenizer=tok, video_processor=None, chat_template=chat_template(IMAGE),
                                          image_seq_length=v.max_soft_tokens)


def is_processor(proc: Any) -> bool:
    """Whether `proc` is a Gemma4Processor or a Gemma4UnifiedProcessor (`processor` and `unified_processor` build
    subclasses of them)."""
    return any(c.__name__ in ("Gemma4Processor", "Gemma4UnifiedProcessor") for c in type(proc).__mro__)


def token_ids(proc: Any) -> dict[str, int]:
    """Gemma4Config's token-id keys and the processor tokenizer's ids (the video token's too, so that no text token
    is taken for it)."""
    tok = proc.tokenizer
    return {"image_token_id": proc.image_token_id, "boi_token_id": tok.convert_tokens_to_ids(BOI),
            "eoi_token_id": tok.convert_tokens_to_ids(EOI), "video_token_id": proc.video_token_id,
            "audio_token_id": proc.audio_token_id, "boa_token_id": tok.convert_tokens_to_ids(BOA)}


def unified_processor(job: JobSpec) -> Any:
    """Gemma 4 unified's processor (processing_gemma4_unified.py `Gemma4UnifiedProcessor`, a Gemma4Processor) around a
    PIL stand-in for its torchvision-only `Gemma4UnifiedImageProcessor` (`unified_image_processor`), with Gemma 4's
    tokens (`processor`)."""
    from transformers.models.gemma4_unified.feature_extraction_gemma4_unified import (
        Gemma4UnifiedAudioFeatureExtractor)
    from transformers.models.gemma4_unified.processing_gemma4_unified import Gemma4UnifiedProcessor

    v = job.model.vision
    tok = _tokenizer()
    images = unified_image_processor()(patch_size=v.patch_size, pooling_kernel_size=v.pooling_kernel_size,
                                       max_soft_tokens=v.max_soft_tokens)
    return without_video(Gemma4UnifiedProcessor)(feature_extractor=Gemma4UnifiedAudioFeatureExtractor(),
                                                 image_processor=images, tokenizer=tok, video_processor=None,
                                                 chat_template=chat_template(IMAGE),
                                                 image_seq_length=v.max_soft_tokens)


def unified_image_processor() -> type:
    """`Gemma4UnifiedImageProcessor._preprocess` (image_processing_gemma4_unified.py) on Gemma4ImageProcessorPil's
    steps: its resize at max_soft_tokens · k² patches, rescale and normalize, `convert_image_to_patches` at
    patch_size, the teacher positions, `patches_merge` (compiled from image_processing_gemma4_unified.py's own source:
    that module imports torchvision) and `pad_along_first_dim` to max_soft_tokens rows."""
    import numpy as np
    import torch
    from transformers.image_processing_utils import BatchFeature
    from transformers.models.gemma4.image_processing_pil_gemma4 import (Gemma4ImageProcessorPil,
                                                                      convert_image_to_patches, pad_along_first_dim)

    merge = source_function("image_processing_gemma4_unified", "patches_merge")

    class Gemma4UnifiedImageProcessorPil(Gemma4ImageProcessorPil):
        def _preprocess(self, images, do_resize, resample, do_rescale, rescale_factor, do_normalize, image_mean,
                        image_std, return_tensors, max_soft_tokens=None, patch_size=None, pooling_kernel_size=None,
                        **kwargs):
            k2 = pooling_kernel_size ** 2
            pixel_values, position_ids, soft = [], [], []
            for image in images:
                if do_resize:
                    image = self.aspect_ratio_preserving_resize(image=image, patch_size=patch_size,
                                                                max_patches=max_soft_tokens * k2,
                                                                pooling_kernel_size=pooling_kernel_size,
                                                                resample=resample)
                if do_rescale:
                    image = self.rescale(image=image, scale=rescale_factor)
                if do_normalize:
                    image = self.normalize(image=image, mean=image_mean, std=image_std)
                teacher = convert_image_to_patches(image, patch_size)
                ph, pw = image.shape[-2] // patch_size, image.shape[-1] // patch_size
                gx, gy = np.meshgrid(np.arange(pw), np.arange(ph), indexing="xy")
                positions = np.stack([gx, gy], axis=-1).reshape(teacher.shape[0], 2)
                merged, merged_pos = merge(torch.from_numpy(np.ascontiguousarray(teacher)).unsqueeze(0),
                                           torch.from_numpy(positions).unsqueeze(0), teacher.shape[0] // k2)
                merged, merged_pos = merged.squeeze(0).numpy(), merged_pos.squeeze(0).numpy()
                soft.append(merged.shape[0])
                merged, merged_pos = pad_along_first_dim(merged, merged_pos, max_soft_tokens)
                pixel_values.append(merged)
                position_ids.append(merged_pos)
            return BatchFeature(data={"pixel_values": np.stack(pixel_values), "image_position_ids":
                                      np.stack(position_ids), "num_soft_tokens_per_image": soft},
                                tensor_type=return_tensors)

    return Gemma4UnifiedImageProcessorPil


def source_function(module: str, name: str) -> Any:
    """A top-level function of transformers' models/gemma4_unified/<module>.py compiled from its source (the module
    itself imports torchvision), with math and torch in its globals."""
    import ast
    import math
    from pathlib import Path

    import torch
    import transformers

    path = Path(transformers.__file__).parent / "models" / "gemma4_unified" / f"{module}.py"
    tree = ast.parse(path.read_text())
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    scope: dict[str, Any] = {"math": math, "torch": torch}
    exec(compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec"), scope)
    return scope[name]


def _tokenizer() -> Any:
    """The word tokenizer with Gemma 4's image and audio tokens added and set (`processor`)."""
    tok = tokenizer()
    tok.add_special_tokens({"additional_special_tokens": [IMAGE, BOI, EOI, BOA, EOA, AUDIO]})
    for key, token in (("image_token", IMAGE), ("boi_token", BOI), ("eoi_token", EOI), ("boa_token", BOA),
                       ("eoa_token", EOA), ("audio_token", AUDIO)):
        setattr(tok, key, token)
    tok.image_token_id = tok.convert_tokens_to_ids(IMAGE)
    tok.audio_token_id = tok.convert_tokens_to_ids(AUDIO)
    return tok

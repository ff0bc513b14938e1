"""The dots3 Note pieces of a vision-language trace (hpcmem.trace.vision for the rest): the processor, its image token
and the tokens around each image.

transformers 5.24 models/dots3_note/processing_dots3_note.py `Dots3NoteProcessor` reads its tokenizer's ids of
<|imgpad|> (the image token, also the placeholder the chat template writes for each image), <|video_pad|> and
<|audio_comp_pad|> in `__init__`; `replace_image_token` expands each placeholder to grid_thw.prod() / merge_size²
image tokens and writes nothing around them: `MARKERS_PER_IMAGE` 0. The word tokenizer gets the three spellings added
as special tokens.

Its image processor (image_processing_auto.py's dots3_note row) is Qwen2VLImageProcessor, whose PIL twin
`Qwen2VLImageProcessorPil` (the same smart_resize and patchify) is built here with the job's min/max_pixels and
temporal_patch_size 1, the rows of 3 · 14² values the patch embedding reads (hpcmem.models.dots3_note). Its feature
extractor is transformers' own `Dots3NoteFeatureExtractor`, which an image-only dataset never calls; its video
processor (Qwen3VLVideoProcessor) needs torchvision: left out (None), which the processor's class check skips.
"""

from __future__ import annotations

from typing import Any

from hpcmem.job.images import pixel_bounds
from hpcmem.job.jobspec import JobSpec
from hpcmem.trace.pieces import chat_template, tokenizer
from hpcmem.trace.vision_llava import without_video

IMAGE, VIDEO, AUDIO = "<|imgpad|>", "<|video_pad|>", "<|audio_comp_pad|>"
MARKERS_PER_IMAGE = 0


def processor(job: JobSpec) -> Any:
    """Dots3NoteProcessor around Qwen2VLImageProcessorPil, the word tokenizer and Dots3NoteFeatureExtractor."""
    from transformers.models.dots3_note.feature_extraction_dots3_note import Dots3NoteFeatureExtractor
    from transformers.models.dots3_note.processing_dots3_note import Dots3NoteProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    v = job.model.vision
    lo, hi = pixel_bounds(job.train)
    images = Qwen2VLImageProcessorPil(min_pixels=lo, max_pixels=hi, patch_size=v.patch_size,
                                      temporal_patch_size=v.temporal_patch_size, merge_size=v.spatial_merge_size)
    tok = tokenizer()
    tok.add_special_tokens({"additional_special_tokens": [IMAGE, VIDEO, AUDIO]})
    return without_video(Dots3NoteProcessor)(image_processor=images, tokenizer=tok, video_processor=None,
                                           feature_extractor=Dots3NoteFeatureExtractor(),
                                           chat_template=chat_template(IMAGE))


def is_processor(proc: Any) -> bool:
    return any(c.__name__ == "Dots3NoteProcessor" for c in type(proc).__mro__)


def token_ids(proc: Any) -> dict[str, int]:
    """Dots3NoteConfig's image, video and audio token ids in the processor's tokenizer."""
    return {"image_token_id": proc.image_token_id, "video_token_id": proc.video_token_id,
            "audio_token_id": proc.audio_token_id}

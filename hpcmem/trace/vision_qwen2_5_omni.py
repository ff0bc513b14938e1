"""The Qwen2.5-Omni thinker pieces of a vision-language trace with images (hpcmem.trace.vision for the rest): the
processor, its tokens and the config's token ids.

transformers 5.24 models/qwen2_5_omni/processing_qwen2_5_omni.py `Qwen2_5OmniProcessor` (the processor
processing_auto.py pairs with qwen2_5_omni) takes an image processor, a video processor, a feature extractor and a
tokenizer, and reads from the tokenizer's attributes (which a checkpoint's tokenizer_config names as
`extra_special_tokens`, set by `_set_model_specific_special_tokens` as from_pretrained does) its image, audio and video
tokens and their ids and the vision and audio begin/end tokens (`__init__`). Per image it writes
image_grid_thw.prod() / merge_size² image tokens (`replace_image_token`) where the chat template wrote one, between
<|vision_bos|> and <|vision_eos|> (Qwen2.5-Omni's chat template): two markers per image, the Qwen placeholder layout
of hpcmem.trace.vision with Omni's spellings (`TOKENS`).

- Image processor: transformers' PIL `Qwen2VLImageProcessorPil` (image_processing_auto.py's "pil" row for
  qwen2_5_omni) with the job's min/max pixels and the tower's patch geometry.
- Feature extractor: transformers' own `WhisperFeatureExtractor` (feature_extraction_auto.py's row for qwen2_5_omni;
  numpy only) with feature_size the audio tower's num_mel_bins; an image-only dataset never calls it
  (OmniModalProcessorMixin.__call__ runs `_process_audio` only on audio).
- Video processor: `Qwen2VLVideoProcessor` needs torchvision, which is not installed. A stand-in carrying what the
  processor reads of it without videos (`model_input_names`, for `Qwen2_5OmniProcessor.model_input_names`;
  merge_size and temporal_patch_size) stands in its place, and the class check skips it; `_process_videos`, the only
  caller of the real one, runs only on videos.

The thinker config reads image_token_id, video_token_id, audio_token_id (its image/video/audio_token_index through
its attribute_map), vision_start_token_id and audio_start_token_id in `get_rope_index` (the released checkpoint's
config names them; Qwen2_5OmniThinkerConfig's class has no vision_start_token_id field): `token_ids` maps them to the
word tokenizer's ids.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from hpcmem.job.images import pixel_bounds
from hpcmem.job.jobspec import JobSpec
from hpcmem.trace.pieces import chat_template, tokenizer

# Qwen2.5-Omni's tokenizer spellings (the released tokenizer_config's extra_special_tokens)
TOKENS = {"image_token": "<|IMAGE|>", "audio_token": "<|AUDIO|>", "video_token": "<|VIDEO|>",
          "vision_bos_token": "<|vision_bos|>", "vision_eos_token": "<|vision_eos|>",
          "audio_bos_token": "<|audio_bos|>", "audio_eos_token": "<|audio_eos|>"}
MARKERS_PER_IMAGE = 2      # <|vision_bos|> and <|vision_eos|> around each image's tokens
CHAT_TEMPLATE = chat_template(TOKENS["vision_bos_token"] + TOKENS["image_token"] + TOKENS["vision_eos_token"])
# Qwen2VLVideoProcessor's model_input_names
VIDEO_INPUTS = ["pixel_values_videos", "video_grid_thw"]


def processor(job: JobSpec) -> Any:
    from transformers import WhisperFeatureExtractor
    from transformers.models.qwen2_5_omni.processing_qwen2_5_omni import Qwen2_5OmniProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    class ImageOnlyProcessor(Qwen2_5OmniProcessor):
        def check_argument_for_proper_class(self, argument_name: str, argument: Any) -> Any:
            if argument_name == "video_processor" and isinstance(argument, SimpleNamespace):
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    v = job.model.vision
    tok = tokenizer()
    tok.add_special_tokens({"additional_special_tokens": list(TOKENS.values())})
    tok._set_model_specific_special_tokens(TOKENS)
    lo, hi = pixel_bounds(job.train, v)
    images = Qwen2VLImageProcessorPil(min_pixels=lo, max_pixels=hi, patch_size=v.patch_size,
                                      temporal_patch_size=v.temporal_patch_size, merge_size=v.spatial_merge_size)
    videos = SimpleNamespace(model_input_names=list(VIDEO_INPUTS), merge_size=v.spatial_merge_size,
                             temporal_patch_size=v.temporal_patch_size)
    audio = WhisperFeatureExtractor(feature_size=v.audio.mel_bins)
    return ImageOnlyProcessor(image_processor=images, video_processor=videos, feature_extractor=audio, tokenizer=tok,
                              chat_template=CHAT_TEMPLATE)


def is_processor(proc: Any) -> bool:
    return isinstance(getattr(proc, "image_token", None), str) and proc.image_token == TOKENS["image_token"]


def token_ids(proc: Any) -> dict[str, int]:
    """The thinker config's token ids (`get_rope_index`, `get_placeholder_mask`) in the processor's tokenizer."""
    tok = proc.tokenizer
    ids = {key: tok.convert_tokens_to_ids(TOKENS[name]) for key, name in (
        ("image_token_id", "image_token"), ("video_token_id", "video_token"), ("audio_token_id", "audio_token"),
        ("vision_start_token_id", "vision_bos_token"), ("vision_end_token_id", "vision_eos_token"),
        ("audio_start_token_id", "audio_bos_token"), ("audio_end_token_id", "audio_eos_token"))}
    return ids

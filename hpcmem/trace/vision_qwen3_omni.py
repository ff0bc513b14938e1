"""The Qwen3-Omni thinker's processor of a vision-language trace with images (hpcmem.trace.vision for the rest).

transformers 5.24 models/qwen3_omni_moe/processing_qwen3_omni_moe.py `Qwen3OmniMoeProcessor` (the processor
models/auto/processing_auto.py pairs with qwen3_omni_moe; an OmniModalProcessorMixin) takes an image processor, a
video processor, a feature extractor and a tokenizer:
- the image processor is the PIL `Qwen2VLImageProcessorPil` (image_processing_auto.py's "pil" row for
  qwen3_omni_moe) with the job's size bounds and the vision config's patch geometry, as Qwen3-VL's trace takes it;
  `replace_image_token` writes grid_t · grid_h · grid_w / merge_size² image tokens, Qwen's count;
- the feature extractor is the class feature_extraction_auto.py names for qwen3_omni_moe, `WhisperFeatureExtractor`
  (numpy only), with the audio config's mel bins; an image-only batch never calls it (`_process_audio` runs on audio
  alone);
- the video processor is left out: `Qwen2VLVideoProcessor` (video_processing_auto.py's only row for qwen3_omni_moe)
  needs torchvision, which is not installed; an image-only batch never calls it (hpcmem.trace.vision_llava
  `without_video`);
- the tokenizer is the word tokenizer with the seven tokens `Qwen3OmniMoeProcessor.__init__` reads as its attributes
  (image_token, audio_token, video_token, vision_bos_token, vision_eos_token, audio_bos_token, audio_eos_token:
  a checkpoint's tokenizer_config names them in `extra_special_tokens`, set here by
  `_set_model_specific_special_tokens` as from_pretrained does), spelled as Qwen's tokenizer spells them.
The chat template writes each image as vision_start, image_pad, vision_end (Qwen's two markers per image), which
`Qwen3OmniMoeThinkerModel.get_rope_index` reads: it finds each image by its vision_start token
(`config.vision_start_token_id`, a key Qwen3OmniMoeThinkerConfig does not declare: the released checkpoint's
thinker_config sets it, tests/fixtures/vlm/qwen3-omni-30b-thinker-width-L2-D2.json), so the model config takes the
tokenizer's ids of all of them (`token_ids`).
"""

from __future__ import annotations

from typing import Any

from hpcmem.job.images import pixel_bounds
from hpcmem.job.jobspec import JobSpec
from hpcmem.trace.pieces import chat_template, tokenizer
from hpcmem.trace.vision_llava import without_video

TOKENS = {"vision_bos_token": "<|vision_start|>", "vision_eos_token": "<|vision_end|>",
          "image_token": "<|image_pad|>", "video_token": "<|video_pad|>", "audio_token": "<|audio_pad|>",
          "audio_bos_token": "<|audio_start|>", "audio_eos_token": "<|audio_end|>"}
CHAT_TEMPLATE = chat_template(TOKENS["vision_bos_token"] + TOKENS["image_token"] + TOKENS["vision_eos_token"])
# Qwen3OmniMoeThinkerConfig's token-id keys (and the two the released thinker_config adds: vision_start_token_id,
# vision_end_token_id) → the tokenizer attribute whose token they name
CONFIG_KEYS = {"vision_start_token_id": "vision_bos_token", "vision_end_token_id": "vision_eos_token",
               "image_token_id": "image_token", "video_token_id": "video_token", "audio_token_id": "audio_token",
               "audio_start_token_id": "audio_bos_token", "audio_end_token_id": "audio_eos_token"}


def processor(job: JobSpec) -> Any:
    from transformers import WhisperFeatureExtractor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import Qwen3OmniMoeProcessor

    v = job.model.vision
    lo, hi = pixel_bounds(job.train, v)
    tok = tokenizer()
    tok.add_special_tokens({"additional_special_tokens": list(TOKENS.values())})
    tok._set_model_specific_special_tokens(TOKENS)
    images = Qwen2VLImageProcessorPil(min_pixels=lo, max_pixels=hi, patch_size=v.patch_size,
                                      temporal_patch_size=v.temporal_patch_size, merge_size=v.spatial_merge_size)
    audio = WhisperFeatureExtractor(feature_size=v.audio.num_mel_bins)
    return without_video(Qwen3OmniMoeProcessor)(image_processor=images, video_processor=None,
                                                feature_extractor=audio, tokenizer=tok, chat_template=CHAT_TEMPLATE)


def is_processor(proc: Any) -> bool:
    return any(c.__name__ == "Qwen3OmniMoeProcessor" for c in type(proc).__mro__)


def token_ids(proc: Any) -> dict[str, int]:
    """The thinker config's token ids in the processor's tokenizer."""
    return {key: proc.tokenizer.convert_tokens_to_ids(TOKENS[attr]) for key, attr in CONFIG_KEYS.items()}

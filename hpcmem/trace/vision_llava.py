"""The llava pieces of a vision-language SFT trace (hpcmem.trace.vision for the rest): the processor and its image
token.

transformers 5.24 models/llava/processing_llava.py `LlavaProcessor` around the PIL `CLIPImageProcessorPil`
(models/clip/image_processing_pil_clip.py: resize the shortest edge, centre-crop, the same steps as the torchvision
one) with llava-hf/llava-1.5-7b-hf's preprocessor settings (shortest edge and crop `image_size`, 336) and processor
settings (patch_size 14, vision_feature_select_strategy "default", num_additional_image_tokens 1: the class token,
which "default" drops again), so `replace_image_token` expands each "<image>" into (336 / 14)² = 576 image tokens.
The chat template writes each image as "<image>" and the text as it is (no markers around the image).
llava_next: models/llava_next/processing_llava_next.py `LlavaNextProcessor` around `LlavaNextImageProcessorPil`
(anyres tiles, hpcmem.models.llava_next), the same image token and template.
llava_next_video: models/llava_next_video/processing_llava_next_video.py `LlavaNextVideoProcessor` around the same
image processor (`next_processor`), its video processor left out.
vipllava: LlavaProcessor as llava's (models/auto/processing_auto.py maps vipllava to it; its projector always drops
the class token: "default"). video_llava: models/video_llava/processing_video_llava.py `VideoLlavaProcessor` around
`VideoLlavaImageProcessor` (`video_llava_processor`), the same image token count rule, its video processor left out.
llava_onevision: models/llava_onevision/processing_llava_onevision.py `LlavaOnevisionProcessor` around
`LlavaOnevisionImageProcessorPil` (anyres tiles, a large image's grid downscaled: hpcmem.models.llava_onevision), the
same image token and template; its video processor left out (`without_video`), as for the Qwen processors.
"""

from __future__ import annotations

from typing import Any

from hpcmem.job.jobspec import JobSpec
from hpcmem.trace.pieces import chat_template, tokenizer

IMAGE_TOKEN = "<image>"
VIDEO_TOKEN = "<video>"     # LlavaOnevisionProcessor's and LlavaNextVideoProcessor's video_token (looked up)
# the llava types this module builds the processor of (no markers around their image tokens)
LLAVA_TYPES = ("llava", "llava_next", "llava_next_video", "llava_onevision", "vipllava", "video_llava")
MARKERS_PER_IMAGE = 0
CHAT_TEMPLATE = chat_template(IMAGE_TOKEN)


def processor(job: JobSpec) -> Any:
    """LlavaProcessor with the tower's image size and patch size (hpcmem.models.clip_tower.ClipTowerSpec);
    llava_next's processor (`next_processor`)."""
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil
    from transformers.models.llava.processing_llava import LlavaProcessor

    v = job.model.vision
    tok = tokenizer()
    tok.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    if v.model_type == "llava_next":
        return next_processor(v, tok)
    if v.model_type in ("llava_onevision", "llava_next_video"):
        tok.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN, VIDEO_TOKEN]})
        return onevision_processor(v, tok) if v.model_type == "llava_onevision" else next_processor(v, tok)
    if v.model_type == "video_llava":
        tok.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN, VIDEO_TOKEN]})
        return video_llava_processor(v, tok)
    images = CLIPImageProcessorPil(size={"shortest_edge": v.image_size},
                                   crop_size={"height": v.image_size, "width": v.image_size})
    return LlavaProcessor(image_processor=images, tokenizer=tok, patch_size=v.patch_size,
                          vision_feature_select_strategy="default" if v.drop_class_token else "full",
                          num_additional_image_tokens=1, chat_template=CHAT_TEMPLATE)


def video_llava_processor(v: Any, tok: Any) -> Any:
    """VideoLlavaProcessor around `VideoLlavaImageProcessor` (resize the shortest edge, centre-crop; LanguageBind/
    Video-LLaVA-7B-hf's settings are its defaults at the tower's 224 px), patch_size, "default" and
    num_additional_image_tokens 1 (its class defaults, as convert_video_llava_weights_to_hf.py saves them), no video
    processor (it needs torchvision; an image-only dataset never calls it)."""
    from transformers.models.video_llava.image_processing_video_llava import VideoLlavaImageProcessor
    from transformers.models.video_llava.processing_video_llava import VideoLlavaProcessor

    images = VideoLlavaImageProcessor(size={"shortest_edge": v.image_size},
                                      crop_size={"height": v.image_size, "width": v.image_size})
    return without_video(VideoLlavaProcessor)(
        image_processor=images, video_processor=None, tokenizer=tok, patch_size=v.patch_size,
        vision_feature_select_strategy="default" if v.drop_class_token else "full", num_additional_image_tokens=1,
        image_token=IMAGE_TOKEN, video_token=VIDEO_TOKEN, chat_template=CHAT_TEMPLATE)


def next_processor(v: Any, tok: Any) -> Any:
    """LlavaNextProcessor around the PIL `LlavaNextImageProcessorPil` with the tower's image size as its shortest edge
    and crop and the config's image_grid_pinpoints (hpcmem.models.llava_next.LlavaNextTowerSpec), as
    llava-hf/llava-v1.6-mistral-7b-hf's preprocessor settings name them (336, its pinpoints). llava_next_video:
    models/llava_next_video/processing_llava_next_video.py `LlavaNextVideoProcessor` around the same image processor
    (its images take the llava_next path; `_get_number_of_features` is LlavaNextProcessor's), no video processor;
    num_additional_image_tokens 1, the class token "default" drops again (its class default 0 would write one image
    token fewer than `pack_image_features` makes rows)."""
    from transformers.models.llava_next.image_processing_pil_llava_next import LlavaNextImageProcessorPil
    from transformers.models.llava_next.processing_llava_next import LlavaNextProcessor
    from transformers.models.llava_next_video.processing_llava_next_video import LlavaNextVideoProcessor

    images = LlavaNextImageProcessorPil(size={"shortest_edge": v.image_size},
                                        crop_size={"height": v.image_size, "width": v.image_size},
                                        image_grid_pinpoints=[list(p) for p in v.grid_pinpoints])
    common = {"image_processor": images, "tokenizer": tok, "patch_size": v.patch_size,
              "vision_feature_select_strategy": "default" if v.drop_class_token else "full",
              "num_additional_image_tokens": 1, "chat_template": CHAT_TEMPLATE}
    if v.model_type == "llava_next_video":
        return without_video(LlavaNextVideoProcessor)(video_processor=None, image_token=IMAGE_TOKEN,
                                                      video_token=VIDEO_TOKEN, **common)
    return LlavaNextProcessor(**common)


def onevision_processor(v: Any, tok: Any) -> Any:
    """LlavaOnevisionProcessor around the PIL `LlavaOnevisionImageProcessorPil` with the tower's image size as its
    square size and the config's image_grid_pinpoints, num_image_tokens the tile's (image_size / patch_size)²
    patches, the config's vision_feature_select_strategy ("full") and vision_aspect_ratio, no video processor."""
    from transformers.models.llava_onevision.image_processing_pil_llava_onevision import (
        LlavaOnevisionImageProcessorPil)
    from transformers.models.llava_onevision.processing_llava_onevision import LlavaOnevisionProcessor

    images = LlavaOnevisionImageProcessorPil(size={"height": v.image_size, "width": v.image_size},
                                             image_grid_pinpoints=[list(p) for p in v.grid_pinpoints])
    return without_video(LlavaOnevisionProcessor)(
        image_processor=images, tokenizer=tok, video_processor=None, num_image_tokens=v.patches,
        vision_feature_select_strategy="full", chat_template=CHAT_TEMPLATE, image_token=IMAGE_TOKEN,
        video_token=VIDEO_TOKEN, vision_aspect_ratio=f"anyres_max_{v.max_num_patches}")


def without_video(base: Any) -> Any:
    """A subclass of the processor class `base` built without its video processor. ProcessorMixin checks each
    sub-processor's class against the auto mappings; without torchvision the video mapping is a placeholder that
    fails that check even for None, so the check skips the absent video processor alone (an image-only dataset never
    calls it)."""

    class ImageOnlyProcessor(base):  # type: ignore[misc,valid-type]
        def check_argument_for_proper_class(self, argument_name: str, argument: Any) -> Any:
            if argument_name == "video_processor" and argument is None:
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    return ImageOnlyProcessor


def token_ids(proc: Any) -> dict[str, int]:
    """LlavaConfig's image token id (`image_token_id`, an alias of image_token_index) in the processor's tokenizer;
    the video token's too where the processor names one (LlavaOnevisionConfig, LlavaNextVideoConfig:
    `video_token_id`), so that no text token is taken for a video's."""
    ids = {"image_token_id": proc.tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)}
    if getattr(proc, "video_token", None) == VIDEO_TOKEN:
        ids["video_token_id"] = proc.tokenizer.convert_tokens_to_ids(VIDEO_TOKEN)
    return ids

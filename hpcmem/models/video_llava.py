"""VideoLlavaTowerSpec: Video-LLaVA's image path — llava's CLIP tower and two-linear projector
(hpcmem.models.clip_tower) — beside a second, idle CLIP tower of the same config for videos.

transformers 5.24 models/video_llava/modeling_video_llava.py `VideoLlavaModel.__init__`: `video_tower` and
`image_tower` are each `AutoModel.from_config(config.vision_config)` (two CLIPVisionModels), `multi_modal_projector`
is llava's (`VideoLlavaMultiModalProjector`: linear_1 → `projector_hidden_act` → linear_2, with bias when
`multimodal_projector_bias`). `get_image_features` runs `image_tower` alone and selects the feature layer as llava does
(`vision_feature_layer`, the class token dropped under "default"); `video_tower` runs only in `get_video_features`, on
pixel_values_videos: with images only it gets no gradient and no optimizer state, but its weights (and under LoRA
"all-linear" its adapters) are loaded.

configuration_video_llava.py `VideoLlavaConfig`: llava's outer defaults (-2, "default", gelu, projector bias) and, for
an omitted vision_config, CLIP ViT-L/14 at 224 px (`sub_configs_defaults` init_kwargs: image_size 224, so 256 image
tokens). The processor (processing_video_llava.py `VideoLlavaProcessor` with `VideoLlavaImageProcessor`: resize the
shortest edge, centre-crop) writes (image_size / patch_size)² tokens per image, as LlavaProcessor does.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from hpcmem.models.clip_tower import ClipTowerSpec, clip_tower_from_config
from hpcmem.models.tower_base import TowerLinear, encoder_layer_linears

# VideoLlavaConfig's `sub_configs_defaults` init_kwargs for an omitted vision_config
VIDEO_LLAVA_VISION_DEFAULTS: dict[str, Any] = {"intermediate_size": 4096, "hidden_size": 1024, "patch_size": 14,
                                               "image_size": 224, "num_hidden_layers": 24, "num_attention_heads": 16}


@dataclass(frozen=True, kw_only=True)
class VideoLlavaTowerSpec(ClipTowerSpec):
    """llava's image tower and projector, and `video_tower`: the same CLIP tower again, which no image runs."""

    def linears(self) -> tuple[TowerLinear, ...]:
        """The image tower's and the projector's (llava's), then the video tower's (part "video": peft wraps them
        under "all-linear" or a matching target, `VideoLlavaModel.video_tower.vision_model.encoder.layers.N`)."""
        video = tuple(TowerLinear(name=x.name, in_features=x.in_features, out_features=x.out_features, count=x.count,
                                  part="video", bias=x.bias)
                      for x in encoder_layer_linears(self.hidden_size, self.intermediate_size, self.depth))
        return (*super().linears(), *video)

    @property
    def idle_params(self) -> int:
        """`video_tower`: a whole CLIPVisionModel of the same config as the image tower."""
        return self.tower_params

    @property
    def num_params(self) -> int:
        return self.tower_params + self.merger_params + self.idle_params


def video_llava_tower_from_config(cfg: dict[str, Any], name: str) -> VideoLlavaTowerSpec:
    """The VideoLlavaTowerSpec of a video_llava config.json dict; keys it omits take VideoLlavaConfig's and
    CLIPVisionConfig's defaults (a list of feature layers is refused as for llava)."""
    base = clip_tower_from_config(cfg, name, model_type="video_llava", vision_defaults=VIDEO_LLAVA_VISION_DEFAULTS)
    return VideoLlavaTowerSpec(**{f.name: getattr(base, f.name) for f in fields(base) if f.init})

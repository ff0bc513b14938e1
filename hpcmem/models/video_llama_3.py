"""VideoLlama3TowerSpec: VideoLLaMA3's (model_type "video_llama_3") vision tower and projector with images, as its
config.json's `vision_config` and outer keys describe them, their linear layers and parameter count (transformers
5.24).

- The config (models/video_llama_3/configuration_video_llama_3.py): `VideoLlama3VisionConfig`'s class defaults fill
  what `vision_config` omits (`VIDEO_LLAMA_3_VISION_DEFAULTS`); `VideoLlama3Config.sub_configs_defaults` builds an
  omitted `text_config` as a bare `qwen2` one; `tie_word_embeddings` False, set True by `__post_init__` when the
  text config's flag is true.
- The tower (modeling_video_llama_3.py `VideoLlama3VisionModel`): a Conv2d patch embedding with bias over each
  pixel_values row viewed as [channels, patch, patch] (`VideoLlama3VisionEmbeddings`), no position table (a 2D
  rotary table, `VideoLlama3VisionRotaryEmbedding`, whose inv_freq is a buffer), `num_hidden_layers`
  `VideoLlama3VisionEncoderLayer`s (LayerNorm → q/k/v/out_proj with biases, attention per image over cu_seqlens chunks
  → LayerNorm → fc1 → `hidden_act` → fc2 with biases) and `post_layernorm`, then `pixel_unshuffle` (a bilinear
  resize of each image's grid by 1 / merge_size; no parameters).
- The projector (`VideoLlama3Projector.readout`): nn.Sequential(Linear(vision width → text width), nn.GELU,
  Linear(text width → text width)), biases.
- The image processor (image_processing_pil_video_llama_3.py `VideoLlama3ImageProcessorPil`): Qwen2-VL's
  smart_resize at factor patch_size · merge_size, temporal_patch_size 1, and `merge_size` 1 for images (the class
  attribute; the video processor's is 2): every patch is one image token, (height / patch) · (width / patch) per
  image (processing_video_llama_3.py `replace_image_token`: grid_thw.prod() // merge_size²). Its patch_size must be
  the vision config's (the embedding views each row as patch × patch pixels).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpcmem.errors import Problems, SpecError
from hpcmem.models.siglip import SIGLIP_ACTIVATIONS
from hpcmem.models.tower_base import (LinearTower, TowerLinear, check_activation, check_counts, check_heads,
                                      encoder_layer_linears, text_width, vision_values)

# configuration_video_llama_3.py `VideoLlama3VisionConfig`'s field defaults
VIDEO_LLAMA_3_VISION_DEFAULTS: dict[str, Any] = {
    "hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
    "num_channels": 3, "patch_size": 16, "hidden_act": "gelu_pytorch_tanh"}
QWEN2_HIDDEN = 4096             # Qwen2Config.hidden_size: the text width of an omitted text_config
IMAGE_MERGE_SIZE = 1            # VideoLlama3ImageProcessorPil.merge_size (class attribute)


@dataclass(frozen=True, kw_only=True)
class VideoLlama3TowerSpec(LinearTower):
    """VideoLLaMA3's SigLIP-NaViT-style tower under its two-linear GELU projector; `out_hidden_size` is the text width.
    The names hpcmem.job.images reads for Qwen2-VL's smart_resize geometry: `spatial_merge_size` (the image
    processor's merge_size), `temporal_patch_size` 1, `image_size` 0 (a dynamic resolution)."""

    spatial_merge_size: int = IMAGE_MERGE_SIZE
    temporal_patch_size: int = 1
    image_size: int = 0
    # what the shared vision code reads of a tower (hpcmem.models.vision_spec.VisionSpec's names)
    norm: str = "layer"
    mlp: str = "fc"
    deepstack_visual_indexes: tuple[int, ...] = ()
    deepstack_params: int = 0
    # `VideoLlama3VisionModel.get_input_embeddings` returns embeddings.patch_embedding, which
    # `enable_input_require_grads` hooks
    hooked_input: bool = True
    family: str = "video_llama_3"

    def __post_init__(self) -> None:
        p = Problems()
        check_counts(p, self, ("depth", "hidden_size", "intermediate_size", "num_heads", "in_channels", "patch_size",
                               "out_hidden_size", "spatial_merge_size"))
        check_activation(p, self.hidden_act, SIGLIP_ACTIVATIONS)
        p.raise_if_any()
        check_heads(p, self.hidden_size, self.num_heads, "num_attention_heads")
        p.raise_if_any()

    @property
    def merge_unit(self) -> int:
        """Patches per image token (merge_size²; 1 for images)."""
        return self.spatial_merge_size ** 2

    def linears(self) -> tuple[TowerLinear, ...]:
        h, i, d, o = self.hidden_size, self.intermediate_size, self.depth, self.out_hidden_size
        return (*encoder_layer_linears(h, i, d),
                TowerLinear(name="readout.0", in_features=h, out_features=o, count=1, part="merger"),
                TowerLinear(name="readout.2", in_features=o, out_features=o, count=1, part="merger"))

    @property
    def embed_params(self) -> int:
        """The Conv2d patch embedding, weight and bias (no position table)."""
        return self.patch_dim * self.hidden_size + self.hidden_size

    @property
    def tower_params(self) -> int:
        """The patch embedding, the encoder layers and post_layernorm (weight and bias)."""
        return self.embed_params + self.depth * self.block_params + 2 * self.hidden_size


def video_llama_3_tower_from_config(cfg: dict[str, Any], name: str) -> VideoLlama3TowerSpec:
    """The VideoLlama3TowerSpec of a video_llama_3 config.json dict; keys it omits take VideoLlama3VisionConfig's
    defaults."""
    vc = vision_values(cfg, name, VIDEO_LLAMA_3_VISION_DEFAULTS)
    if isinstance(vc["patch_size"], (list, tuple)):
        raise SpecError(f"model {name}: vision_config.patch_size {vc['patch_size']!r}: hpcmem models square patches "
                        "(an integer)")
    return VideoLlama3TowerSpec(model_type="video_llama_3", depth=vc["num_hidden_layers"],
                                hidden_size=vc["hidden_size"], intermediate_size=vc["intermediate_size"],
                                num_heads=vc["num_attention_heads"], in_channels=vc["num_channels"],
                                patch_size=vc["patch_size"], out_hidden_size=text_width(cfg, QWEN2_HIDDEN),
                                hidden_act=str(vc["hidden_act"]))

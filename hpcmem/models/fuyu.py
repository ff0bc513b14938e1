"""FuyuTowerSpec: Fuyu's (model_type "fuyu") image path, which has no vision tower: one nn.Linear over raw pixel
patches, and its processor's patch grid (transformers 5.24 models/fuyu/).

- The config (configuration_fuyu.py `FuyuConfig`): patch_size 30, num_channels 3, image_size 300 (read by nothing in
  the model), tie_word_embeddings False, image_token_id; `sub_configs_defaults` builds an omitted `text_config` as a
  `persimmon` config (PersimmonConfig's class defaults, which the init_kwargs repeat: width 4096, MLP 16384, 36 layers,
  64 heads, vocab 262144, relu2, q/k LayerNorms); Persimmon's decoder has no family descriptor: a learned profile of
  the text config (hpcmem.models.vlm_learned).
- The model (modeling_fuyu.py `FuyuModel`): `vision_embed_tokens = nn.Linear(patch_size² · num_channels, text
  hidden_size)` (with bias) run by `get_image_features` on pixel_values [patches, patch_size² · 3] (the processor's
  `image_patches`, every image's patches concatenated), its output cast to the embeddings' dtype and placed into the
  image tokens' rows by `masked_scatter` (`forward`); `language_model` is `AutoModel.from_config(text_config)`
  (PersimmonModel); `FuyuForCausalLM.lm_head` untied.
- The processor (image_processing_pil_fuyu.py `FuyuImageProcessorPil`, class defaults: size 1080 × 1920, patch_size
  30 × 30, do_pad with 1.0): an image larger than 1080 × 1920 on either side is scaled down, aspect kept, by
  min(1080 / h, 1920 / w) with int() on each side (`resize`; a smaller one is left as it is), then padded to
  1080 × 1920; processing_fuyu.py `FuyuProcessor._process_images` crops the padded image to the resized sides rounded
  up to whole patches (`new_h = min(1080, ceil(h / 30) · 30)`, likewise the width) and patchifies that
  (`patchify_image`): rows × columns patches; `replace_image_token` writes columns |SPEAKER| tokens and one |NEWLINE|
  per patch row, then <s>: `image_tokens` is the |SPEAKER| count (one per patch, what masked_scatter fills), the
  newlines and <s> are text (hpcmem.trace.vision_fuyu `markers`). One image per row (`prepare_inputs_layout` writes
  one |SPEAKER| per sample: "Fuyu can't do multi-image", processing_fuyu.py `_get_num_multimodal_tokens`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from hpcmem.errors import SpecError
from hpcmem.models.tower_base import TowerBase, TowerLinear, text_width

# configuration_fuyu.py `FuyuConfig`'s field defaults
FUYU_DEFAULTS: dict[str, Any] = {"patch_size": 30, "num_channels": 3, "image_size": 300}
# `FuyuImageProcessorPil.size`'s class default: the canvas every image is fitted into and padded to
FUYU_TARGET = (1080, 1920)
PERSIMMON_HIDDEN = 4096     # PersimmonConfig.hidden_size: the text width of an omitted text_config
# FuyuConfig.sub_configs_defaults["text_config"].init_kwargs: the text config of a config.json that names none (the
# flat Hub layout's text keys, which `__post_init__` moves into text_config, are read over it)
FUYU_TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 262144, "max_position_embeddings": 16384, "hidden_size": 4096, "intermediate_size": 16384,
    "num_hidden_layers": 36, "num_attention_heads": 64, "hidden_act": "relu2", "layer_norm_eps": 1e-5,
    "qk_layernorm": True, "hidden_dropout": 0.0, "attention_dropout": 0.0}


@dataclass(frozen=True, kw_only=True)
class FuyuTowerSpec(TowerBase):
    """No encoder (`depth` 0): `vision_embed_tokens`, Linear(patch_size² · 3 → text width) over every patch; one
    image token per patch."""

    target_height: int = FUYU_TARGET[0]
    target_width: int = FUYU_TARGET[1]
    image_size: int = 0            # no fixed square resize (hpcmem.job.image_rules `_fixed_size_problems`)
    norm: str = "layer"
    mlp: str = "fc"
    fixed_resolution: bool = False
    deepstack_visual_indexes: tuple[int, ...] = ()
    family: str = "fuyu"
    # vision_embed_tokens is no input embedding (FuyuModel.get_input_embeddings is the language model's):
    # `enable_input_require_grads` hooks the token embeddings only
    hooked_input: bool = False

    def resized(self, height: int, width: int) -> tuple[int, int]:
        """`FuyuImageProcessorPil.resize`: scaled into the target canvas (aspect kept, int() per side) only when larger."""
        th, tw = self.target_height, self.target_width
        if height <= th and width <= tw:
            return height, width
        scale = min(th / height, tw / width)
        return int(height * scale), int(width * scale)

    def grid(self, height: int, width: int) -> tuple[int, int]:
        """(rows, columns) of patches: the resized sides rounded up to whole patches, at most the padded canvas
        (`FuyuProcessor._process_images`)."""
        h, w = self.resized(height, width)
        p = self.patch_size
        return (min(self.target_height, math.ceil(h / p) * p) // p,
                min(self.target_width, math.ceil(w / p) * p) // p)

    def image_patches(self, height: int, width: int) -> int:
        rows, cols = self.grid(height, width)
        return rows * cols

    def image_tokens(self, height: int, width: int) -> int:
        """|SPEAKER| tokens of one image: one per patch (`replace_image_token`)."""
        return self.image_patches(height, width)

    def linears(self) -> tuple[TowerLinear, ...]:
        """`vision_embed_tokens` (peft's "all-linear" wraps it: it is no output embedding)."""
        return (TowerLinear(name="vision_embed_tokens", in_features=self.patch_dim, out_features=self.out_hidden_size,
                            count=1, part="merger"),)

    @property
    def block_params(self) -> int:
        return 0

    @property
    def tower_params(self) -> int:
        return 0

    @property
    def merger_params(self) -> int:
        """vision_embed_tokens' weight and bias."""
        return sum(x.params for x in self.linears())

    @property
    def num_params(self) -> int:
        return self.merger_params


def fuyu_tower_from_config(cfg: dict[str, Any], name: str) -> FuyuTowerSpec:
    """The FuyuTowerSpec of a fuyu config.json dict; keys it omits take FuyuConfig's defaults, the processor's canvas
    FuyuImageProcessorPil's class default."""
    vc = {**FUYU_DEFAULTS, **{k: cfg[k] for k in FUYU_DEFAULTS if k in cfg}}
    for key in ("patch_size", "num_channels"):
        value = vc[key]
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise SpecError(f"model {name}: {key} must be an integer ≥ 1, got {value!r}")
    if any(side % vc["patch_size"] for side in FUYU_TARGET):
        # FuyuImageProcessorPil.get_num_patches raises when the padded canvas is no whole number of patches
        raise SpecError(f"model {name}: patch_size {vc['patch_size']} does not divide the processor's 1080 × 1920 "
                        "canvas (FuyuImageProcessorPil.get_num_patches raises)")
    text = cfg.get("text_config")
    width = text_width(cfg, cfg.get("hidden_size", PERSIMMON_HIDDEN)) if isinstance(text, dict) else \
        cfg.get("hidden_size", PERSIMMON_HIDDEN)
    return FuyuTowerSpec(model_type="fuyu", depth=0, hidden_size=width, intermediate_size=0, num_heads=0,
                         in_channels=vc["num_channels"], patch_size=vc["patch_size"], out_hidden_size=width,
                         hidden_act="")


def fuyu_problems(images_per_example: int, min_pixels: Any, max_pixels: Any) -> list[str]:
    """processing_fuyu.py `FuyuProcessor.prepare_inputs_layout` writes one |SPEAKER| per sample whatever its images,
    so a second image has no placeholder ("Fuyu can't do multi-image", `_get_num_multimodal_tokens`);
    FuyuImageProcessorPil has no min_pixels / max_pixels (its canvas decides)."""
    out = []
    if images_per_example > 1:
        out.append(f"images_per_example {images_per_example} on fuyu: FuyuProcessor places one image per row (it "
                   "writes one image placeholder per sample); give images_per_example 1")
    if min_pixels is not None or max_pixels is not None:
        out.append("min_pixels/max_pixels on fuyu: FuyuImageProcessor has no such setting (it fits each image into "
                   "its 1080 × 1920 canvas and cuts it into 30 px patches)")
    return out

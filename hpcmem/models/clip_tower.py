"""ClipTowerSpec: LLaVA-1.5's vision tower (a CLIP ViT) and its multimodal projector, as the llava config.json's
`vision_config` and outer keys describe them, their linear layers and parameter count.

transformers 5.24 models/llava/modeling_llava.py `LlavaModel`: `vision_tower` is `AutoModel.from_config(vision_config)`,
a `CLIPVisionModel` (models/clip/modeling_clip.py): `CLIPVisionEmbeddings` (a Conv2d patch embedding without bias, a
learned class embedding, a learned position table of (image_size / patch_size)² + 1 rows), `pre_layrnorm`, `depth`
`CLIPEncoderLayer`s (LayerNorm → attention with separate q/k/v/out_proj, all with bias → LayerNorm → fc1 → quick_gelu →
fc2, both with bias; full attention over the image's patches and the class token) and `post_layernorm`.
`LlavaMultiModalProjector`: linear_1 (tower width × feature layers → text width) → `projector_hidden_act` (GELU) →
linear_2 (text width → text width), with bias when `multimodal_projector_bias`.

What runs (`LlavaModel.get_image_features`): the tower runs every layer (the last too, whatever
`vision_feature_layer` picks; `select_hidden_states` only asks `capture_outputs` to record the layers' outputs) and
`post_layernorm` on the class token; the projector reads layer `vision_feature_layer`'s output (-2: the input of the
last layer) without the class token (`vision_feature_select_strategy` "default"). So the layers after the feature
layer and post_layernorm are off the loss's path: they get no gradient.

The processor (models/llava/processing_llava.py `LlavaProcessor` with `CLIPImageProcessor`: resize the shortest edge to
`image_size`, centre-crop `image_size` × `image_size`) hands every image as [3, image_size, image_size] whatever its
size, and puts (image_size / patch_size)² image tokens into the text: one resolution only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from hpcmem.errors import Problems, SpecError
from hpcmem.models.tower_base import (LinearTower, TowerLinear, check_activation, check_counts, check_heads,
                                      check_whole_grid, encoder_layer_linears, grid_patches, text_width)

# CLIPVisionConfig's class defaults (models/clip/configuration_clip.py) under LlavaConfig's `sub_configs_defaults`
# init_kwargs for an omitted vision_config (models/llava/configuration_llava.py)
CLIP_DEFAULTS: dict[str, Any] = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
                                 "num_attention_heads": 12, "num_channels": 3, "image_size": 224, "patch_size": 32,
                                 "hidden_act": "quick_gelu"}
LLAVA_VISION_DEFAULTS: dict[str, Any] = {"intermediate_size": 4096, "hidden_size": 1024, "patch_size": 14,
                                         "image_size": 336, "num_hidden_layers": 24, "num_attention_heads": 16}
# LlavaConfig's own defaults
LLAVA_DEFAULTS: dict[str, Any] = {"vision_feature_layer": -2, "vision_feature_select_strategy": "default",
                                  "projector_hidden_act": "gelu", "multimodal_projector_bias": True}
# the activations whose saved tensors hpcmem.estimate.vision_llava derives
CLIP_ACTIVATIONS = ("quick_gelu", "gelu")


@dataclass(frozen=True, kw_only=True)
class ClipTowerSpec(LinearTower):
    """A CLIP vision tower and a LLaVA projector (names follow CLIPVisionConfig: hidden_size is the tower width;
    out_hidden_size is the language model's width, the projector's output)."""

    image_size: int
    projector_act: str
    projector_bias: bool
    feature_layer: int          # vision_feature_layer (an index into the hidden states: 0 the embeddings)
    drop_class_token: bool      # vision_feature_select_strategy "default"
    # what the shared vision code reads of a tower (hpcmem.models.vision_spec.VisionSpec's names): LayerNorm, fc1 → act → fc2
    norm: str = "layer"
    mlp: str = "fc"
    deepstack_visual_indexes: tuple[int, ...] = ()
    deepstack_params: int = 0
    fixed_resolution: bool = True
    family: str = "clip"        # VisionSpec.family's value for this tower (the Qwen towers "qwen", Gemma 3's "siglip")
    # the MLP activations whose saved tensors the estimate derives for this tower (LLaVA-OneVision's SigLIP: its own)
    activations: ClassVar[tuple[str, ...]] = CLIP_ACTIVATIONS
    # the image cut into whole patches; SigLIP's 384 px at 14 px patches is not: its stride-14 Conv2d makes 27 × 27
    # patches and leaves the last 6 pixels out (modeling_siglip.py SiglipVisionEmbeddings.num_patches)
    whole_grid: ClassVar[bool] = True
    # what get_image_features reads: a layer's output from the hidden states `capture_outputs` records (llava's), so
    # post_layernorm runs off the loss's path; or `last_hidden_state`, after post_layernorm, with no hidden states
    # asked for (models/cohere2_vision/modeling_cohere2_vision.py `Cohere2VisionModel.get_image_features`)
    reads_last_hidden_state: ClassVar[bool] = False

    def __post_init__(self) -> None:
        p = Problems()
        check_counts(p, self, ("depth", "hidden_size", "intermediate_size", "num_heads", "in_channels", "image_size",
                               "patch_size", "out_hidden_size"))
        check_activation(p, self.hidden_act, self.activations)
        p.check(self.projector_act == "gelu",
                f"projector_hidden_act {self.projector_act!r}: what it keeps for backward is derived only for gelu")
        p.raise_if_any()
        check_heads(p, self.hidden_size, self.num_heads, "num_attention_heads")
        if self.whole_grid:
            check_whole_grid(p, self.image_size, self.patch_size)
        p.check(self.image_size >= self.patch_size,
                f"vision_config.image_size {self.image_size} is smaller than patch_size {self.patch_size}")
        p.check(-self.depth <= self.feature_layer <= self.depth and self.feature_layer != 0,
                f"vision_feature_layer {self.feature_layer} must pick a layer's output: -{self.depth}..-1 or "
                f"1..{self.depth} (hpcmem models one feature layer, not the embeddings)")
        p.raise_if_any()

    @property
    def patches(self) -> int:
        """Patches per image: (image_size / patch_size)²."""
        return grid_patches(self.image_size, self.patch_size)

    @property
    def positions(self) -> int:
        """Rows the tower runs per image: the patches and the class token (CLIPVisionEmbeddings.num_positions)."""
        return self.patches + 1

    @property
    def tokens_per_image(self) -> int:
        """Image tokens per image in the text: the projector's rows (the class token dropped under "default")."""
        return self.patches if self.drop_class_token else self.positions

    @property
    def trained_layers(self) -> int:
        """Encoder layers on the loss's path: those up to the feature layer (hidden_states[k] is layer k's output)."""
        return self.feature_layer if self.feature_layer > 0 else self.depth + 1 + self.feature_layer

    def linears(self) -> tuple[TowerLinear, ...]:
        h, i, d, o = self.hidden_size, self.intermediate_size, self.depth, self.out_hidden_size
        return (*encoder_layer_linears(h, i, d),
                TowerLinear(name="linear_1", in_features=h, out_features=o, count=1, part="merger",
                           bias=self.projector_bias),
                TowerLinear(name="linear_2", in_features=o, out_features=o, count=1, part="merger",
                           bias=self.projector_bias))

    @property
    def embed_params(self) -> int:
        """The patch embedding (no bias), the class embedding and the position table."""
        h = self.hidden_size
        return self.patch_dim * h + h + self.positions * h

    @property
    def tile_values(self) -> int:
        """Values of one image_size × image_size tile of pixel_values: in_channels × image_size² (more than its
        patches' when the patches do not cover the tile: the Conv2d leaves the rest out, but the tensor holds it)."""
        return self.in_channels * self.image_size ** 2

    @property
    def pre_norm_params(self) -> int:
        """`pre_layrnorm` (weight and bias) between the embeddings and the first layer; a SigLIP tower has none."""
        return 2 * self.hidden_size

    @property
    def tower_params(self) -> int:
        """Embeddings, pre_layrnorm, the encoder layers and post_layernorm."""
        return self.embed_params + self.pre_norm_params + self.post_norm_params + self.block_params * self.depth

    @property
    def idle_params(self) -> int:
        """Parameters of modules an image never runs (Video-LLaVA's video tower, hpcmem.models.video_llava); llava has
        none."""
        return 0

    @property
    def post_norm_params(self) -> int:
        """`post_layernorm` (weight and bias) after the layers."""
        return 2 * self.hidden_size

    @property
    def unused_params(self) -> int:
        """Parameters off the loss's path (no gradient, no optimizer state): the layers after the feature layer,
        post_layernorm (unless `reads_last_hidden_state`) and any idle module."""
        post = 0 if self.reads_last_hidden_state else self.post_norm_params
        return (self.depth - self.trained_layers) * self.block_params + post + self.idle_params


def clip_tower_from_config(cfg: dict[str, Any], name: str, model_type: str = "llava",
                           vision_defaults: dict[str, Any] = LLAVA_VISION_DEFAULTS) -> ClipTowerSpec:
    """The ClipTowerSpec of a llava config.json dict (llava_next's: the same keys and defaults, LlavaNextConfig); keys
    it omits take the config classes' defaults (`vision_defaults`: the outer config's init_kwargs for an omitted
    vision_config)."""
    raw = cfg.get("vision_config")
    if raw is not None and not isinstance(raw, dict):
        raise SpecError(f"model {name}: vision_config must be an object, got {type(raw).__name__}")
    if raw is not None and raw.get("model_type", "clip_vision_model") != "clip_vision_model":
        raise SpecError(f"model {name}: {model_type}'s vision_config.model_type {raw.get('model_type')!r} is not "
                        f"modelled; hpcmem models {model_type} with a CLIP tower (clip_vision_model)")
    vc = {**CLIP_DEFAULTS, **(raw if raw is not None else vision_defaults)}
    outer = {**LLAVA_DEFAULTS, **{k: cfg[k] for k in LLAVA_DEFAULTS if k in cfg}}
    return ClipTowerSpec(model_type=model_type, depth=vc["num_hidden_layers"], hidden_size=vc["hidden_size"],
                         intermediate_size=vc["intermediate_size"], num_heads=vc["num_attention_heads"],
                         in_channels=vc["num_channels"], image_size=vc["image_size"], patch_size=vc["patch_size"],
                         out_hidden_size=text_width(cfg, 4096),      # LlamaConfig.hidden_size
                         hidden_act=str(vc["hidden_act"]), projector_act=str(outer["projector_hidden_act"]),
                         projector_bias=bool(outer["multimodal_projector_bias"]),
                         feature_layer=feature_layer(outer, name), drop_class_token=drops_class_token(outer, name))


def feature_layer(outer: dict[str, Any], name: str) -> int:
    """The outer config's vision_feature_layer: one integer (a list of layers is not modelled)."""
    layer = outer["vision_feature_layer"]
    if not isinstance(layer, int) or isinstance(layer, bool):
        raise SpecError(f"model {name}: vision_feature_layer {layer!r}: hpcmem models one feature layer (an integer)")
    return layer


def drops_class_token(outer: dict[str, Any], name: str) -> bool:
    """vision_feature_select_strategy "default" drops the class token's row, "full" keeps it."""
    strategy = outer["vision_feature_select_strategy"]
    if strategy not in ("default", "full"):
        raise SpecError(f"model {name}: vision_feature_select_strategy must be default or full, got {strategy!r}")
    return strategy == "default"

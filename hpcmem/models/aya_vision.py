"""AyaVisionTowerSpec: Aya Vision's (model_type "aya_vision") SigLIP tower and pixel-shuffle SwiGLU projector, as its
config.json's `vision_config` and outer keys describe them, their linear layers and parameter count (transformers
5.24).

- The config (models/aya_vision/configuration_aya_vision.py `AyaVisionConfig`): `sub_configs_defaults` builds an
  omitted `vision_config` as a `siglip_vision_model` (width 1152, MLP 4304, 14 px patches, 384 px, 26 layers,
  vision_use_head false; SiglipVisionConfig's class defaults for the rest) and an omitted `text_config` as a bare
  `cohere2`; vision_feature_layer -1, vision_feature_select_strategy "full", downsample_factor 2,
  tie_word_embeddings True.
- The tower (modeling_aya_vision.py `AyaVisionModel.vision_tower`, `AutoModel.from_config`): modeling_siglip.py
  `SiglipVisionModel`, counted by hpcmem.models.siglip `siglip_tower_params`; `get_image_features` reads
  hidden_states[-1] (the last layer's output, before post_layernorm, which runs off the loss's path), every patch
  kept ("full"): LLaVA-OneVision's reading of the same tower (hpcmem.models.llava_onevision).
- The projector (`AyaVisionMultiModalProjector`): `pixel_shuffle` folds each 2 × 2 block of patches into one row of
  4 · width, `layernorm` over it, linear_1 (4 · width → alignment_intermediate_size, bias), the output chunked into
  x and gate, `silu(gate) * x`, linear_2 (alignment_intermediate_size / 2 → text width, bias);
  alignment_intermediate_size defaults to the text width (`getattr(config, ..., text_config.hidden_size)`).
- The processor (processing_aya_vision.py `AyaVisionProcessor`, `images_kwargs = {"crop_to_patches": True}`, around
  GotOcr2ImageProcessorPil with max_patches 12): InternVL's tiles and thumbnail (hpcmem.models.internvl
  `internvl_tiles`), each tile (image_size / patch_size)² / downsample_factor² image tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from hpcmem.errors import SpecError
from hpcmem.models.clip_tower import ClipTowerSpec, feature_layer
from hpcmem.models.internvl import PROCESSOR_DEFAULTS, internvl_tiles
from hpcmem.models.siglip import SIGLIP_ACTIVATIONS, SIGLIP_DEFAULTS, SiglipTowerCounts
from hpcmem.models.tower_base import TowerLinear, encoder_layer_linears, text_width

# AyaVisionConfig's sub_configs_defaults init_kwargs for an omitted vision_config
AYA_VISION_DEFAULTS: dict[str, Any] = {"hidden_size": 1152, "intermediate_size": 4304, "patch_size": 14,
                                       "image_size": 384, "num_hidden_layers": 26, "num_attention_heads": 14,
                                       "vision_use_head": False}
# AyaVisionConfig's own defaults
AYA_DEFAULTS: dict[str, Any] = {"vision_feature_layer": -1, "vision_feature_select_strategy": "full",
                                "downsample_factor": 2}
COHERE2_HIDDEN = 8192       # Cohere2Config.hidden_size: the text width of an omitted text_config


@dataclass(frozen=True, kw_only=True)
class AyaVisionTowerSpec(SiglipTowerCounts, ClipTowerSpec):
    """A SigLIP tower read at its last layer under Aya Vision's pixel-shuffle SwiGLU projector; InternVL's tiles."""

    scale_factor: int           # downsample_factor
    alignment: int              # alignment_intermediate_size: linear_1's output, twice linear_2's input
    min_patches: int
    max_patches: int
    crop_to_patches: bool
    fixed_resolution: bool = False
    family: str = "aya_vision"
    activations: ClassVar[tuple[str, ...]] = SIGLIP_ACTIVATIONS
    # AyaVisionMultiModalProjector's `layernorm` over 4 · width after pixel_shuffle (Cohere2Vision's projector has
    # none: hpcmem.models.cohere2_vision)
    projector_norm: ClassVar[bool] = True

    @property
    def tile(self) -> int:
        return self.image_size

    @property
    def tokens_per_image(self) -> int:
        """Image tokens per tile: the patches pixel_shuffle folds, downsample_factor² into one."""
        return self.patches // self.scale_factor ** 2

    @property
    def merged_width(self) -> int:
        return self.hidden_size * self.scale_factor ** 2

    def linears(self) -> tuple[TowerLinear, ...]:
        h, i, d, o = self.hidden_size, self.intermediate_size, self.depth, self.out_hidden_size
        return (*encoder_layer_linears(h, i, d),
                TowerLinear(name="linear_1", in_features=self.merged_width, out_features=self.alignment, count=1,
                            part="merger"),
                TowerLinear(name="linear_2", in_features=self.alignment // 2, out_features=o, count=1, part="merger"))

    @property
    def merger_params(self) -> int:
        """The projector's LayerNorm over the merged width (`projector_norm`) and its two linears."""
        norm = 2 * self.merged_width if self.projector_norm else 0
        return norm + sum(x.params for x in self.linears() if x.part == "merger")

    def tiles(self, height: int, width: int) -> tuple[int, int, int]:
        """(tiles, columns, rows) of one image (hpcmem.models.internvl `internvl_tiles`)."""
        return internvl_tiles(height, width, self.tile, self.min_patches, self.max_patches, self.crop_to_patches)


def aya_vision_tower_from_config(cfg: dict[str, Any], name: str, *, model_type: str = "aya_vision",
                                 vision_defaults: dict[str, Any] = AYA_VISION_DEFAULTS,
                                 outer_keys: tuple[str, ...] = tuple(AYA_DEFAULTS), alignment: int | None = None,
                                 spec: type[AyaVisionTowerSpec] = AyaVisionTowerSpec) -> AyaVisionTowerSpec:
    """The AyaVisionTowerSpec of an aya_vision config.json dict; keys it omits take the config classes' defaults.
    A type built on Aya Vision's classes (hpcmem.models.cohere2_vision) passes its own `model_type`, the init_kwargs
    of an omitted vision_config (`vision_defaults`), the outer keys its config class has (`outer_keys`, the others
    at AYA_DEFAULTS), alignment_intermediate_size's default (`alignment`: None, the text width) and its `spec`."""
    raw = cfg.get("vision_config")
    if raw is not None and not isinstance(raw, dict):
        raise SpecError(f"model {name}: vision_config must be an object, got {type(raw).__name__}")
    if raw is not None and raw.get("model_type", "siglip_vision_model") != "siglip_vision_model":
        raise SpecError(f"model {name}: {model_type}'s vision_config.model_type {raw.get('model_type')!r} is not "
                        f"modelled; hpcmem models {model_type} with a SigLIP tower (siglip_vision_model)")
    vc = {**SIGLIP_DEFAULTS, **(raw if raw is not None else vision_defaults)}
    for key in ("image_size", "patch_size"):
        if isinstance(vc[key], (list, tuple)):
            raise SpecError(f"model {name}: vision_config.{key} {vc[key]!r}: hpcmem models square images (an integer)")
    if vc.get("vision_use_head"):
        raise SpecError(f"model {name}: vision_config.vision_use_head true: SiglipVisionModel runs its attention-"
                        f"pooling head on every tile, which hpcmem does not model for {model_type}")
    outer = {**AYA_DEFAULTS, **{k: cfg[k] for k in outer_keys if k in cfg}}
    if outer["vision_feature_select_strategy"] != "full":
        raise SpecError(f"model {name}: vision_feature_select_strategy {outer['vision_feature_select_strategy']!r}: "
                        f"a SigLIP tower has no class token to drop; hpcmem models {model_type} with 'full'")
    factor = outer["downsample_factor"]
    side = vc["image_size"] // vc["patch_size"]
    if not isinstance(factor, int) or isinstance(factor, bool) or factor < 1 or side % factor:
        raise SpecError(f"model {name}: downsample_factor {factor!r} must be a positive integer dividing the "
                        f"{side} patches a side (AyaVisionMultiModalProjector.pixel_shuffle)")
    text = text_width(cfg, COHERE2_HIDDEN)
    alignment = cfg.get("alignment_intermediate_size", text if alignment is None else alignment)
    proc = {**PROCESSOR_DEFAULTS, **{k: cfg[k] for k in PROCESSOR_DEFAULTS if k in cfg}}
    return spec(
        model_type=model_type, depth=vc["num_hidden_layers"], hidden_size=vc["hidden_size"],
        intermediate_size=vc["intermediate_size"], num_heads=vc["num_attention_heads"], in_channels=vc["num_channels"],
        image_size=vc["image_size"], patch_size=vc["patch_size"], out_hidden_size=text,
        # projector_act and projector_bias are ClipTowerSpec's llava fields, not read for Aya's SwiGLU projector
        # (its saved tensors: hpcmem.estimate.vision_aya)
        hidden_act=str(vc["hidden_act"]), projector_act="gelu", projector_bias=True,
        feature_layer=feature_layer(outer, model_type), drop_class_token=False, scale_factor=factor,
        alignment=alignment, min_patches=proc["min_patches"], max_patches=proc["max_patches"],
        crop_to_patches=bool(proc["crop_to_patches"]))

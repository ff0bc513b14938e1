"""PaliGemmaTowerSpec: PaliGemma's (model_type "paligemma") vision tower and projector, as its config.json's
`vision_config` and outer keys describe them, their linear layers and parameter count (transformers 5.24).

- The tower (models/paligemma/modeling_paligemma.py `PaliGemmaModel.vision_tower`, `AutoModel.from_config` of a
  `siglip_vision_model` config): models/siglip/modeling_siglip.py `SiglipVisionModel`, counted by
  hpcmem.models.siglip `siglip_tower_params` (a Conv2d patch embedding with bias, a position table of
  (image_size / patch_size)² rows, `num_hidden_layers` encoder layers, post_layernorm; the attention-pooling head when
  `vision_use_head`, which PaliGemma never reads).
- The projector (`PaliGemmaMultiModalProjector`): one nn.Linear(vision hidden_size → projection_dim) with bias on the
  tower's `last_hidden_state` (after post_layernorm), every patch one image token:
  (image_size / patch_size)² tokens per image (`PaliGemmaConfig.__post_init__` num_image_tokens; 224 px / 14 → 256,
  448 → 1,024, 896 → 4,096). `projection_dim` is the outer config's (it overwrites vision_config.projection_dim) and
  must equal the text model's width: `get_placeholder_mask` scatters the projector's rows into the token embeddings.
- The image processor (models/siglip/image_processing_siglip.py `SiglipImageProcessor`, as the published
  preprocessor_config.json names it) resizes every image to image_size × image_size: one resolution.
- The decoder is what text_config names (Gemma for PaliGemma 1, Gemma 2 for PaliGemma 2); PaliGemmaConfig ties the
  word embeddings by default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpcmem.errors import Problems, SpecError
from hpcmem.models.siglip import SIGLIP_ACTIVATIONS, SIGLIP_DEFAULTS, SiglipTowerCounts
from hpcmem.models.tower_base import (LinearTower, TowerLinear, check_activation, check_counts, check_heads,
                                      check_whole_grid, encoder_layer_linears, grid_patches, text_width)

# PaliGemmaConfig's `sub_configs_defaults` init_kwargs (models/paligemma/configuration_paligemma.py): the vision config
# an omitted `vision_config` takes (one that is given takes SiglipVisionConfig's class defaults for what it omits), and
# the text config's width an omitted `text_config` takes (GemmaConfig with hidden_size 2048)
PALIGEMMA_VISION_DEFAULTS: dict[str, Any] = {"intermediate_size": 4096, "hidden_size": 1152, "patch_size": 14,
                                             "image_size": 224, "num_hidden_layers": 27, "num_attention_heads": 16,
                                             "vision_use_head": False}
PALIGEMMA_TEXT_HIDDEN = 2048
PROJECTION_DIM = 2048           # PaliGemmaConfig.projection_dim


@dataclass(frozen=True, kw_only=True)
class PaliGemmaTowerSpec(SiglipTowerCounts, LinearTower):
    """A SigLIP tower and PaliGemma's one-Linear projector; `out_hidden_size` is projection_dim (the text width)."""

    image_size: int
    pooling_head: bool = False  # vision_use_head: SiglipMultiheadAttentionPoolingHead loaded, its output never read
    # what the shared vision code reads of a tower (hpcmem.models.vision_spec.VisionSpec's names)
    norm: str = "layer"
    mlp: str = "fc"
    deepstack_visual_indexes: tuple[int, ...] = ()
    deepstack_params: int = 0
    hooked_input: bool = True
    fixed_resolution: bool = True
    family: str = "paligemma"

    def __post_init__(self) -> None:
        p = Problems()
        check_counts(p, self, ("depth", "hidden_size", "intermediate_size", "num_heads", "in_channels", "image_size",
                               "patch_size", "out_hidden_size"))
        check_activation(p, self.hidden_act, SIGLIP_ACTIVATIONS)
        p.raise_if_any()
        check_heads(p, self.hidden_size, self.num_heads, "num_attention_heads")
        check_whole_grid(p, self.image_size, self.patch_size)
        p.raise_if_any()

    @property
    def patches(self) -> int:
        """Patches per image, the tower's rows per image: (image_size / patch_size)²."""
        return grid_patches(self.image_size, self.patch_size)

    @property
    def tokens_per_image(self) -> int:
        """Image tokens per image: one per patch (the projector keeps every row)."""
        return self.patches

    def linears(self) -> tuple[TowerLinear, ...]:
        h, i, d = self.hidden_size, self.intermediate_size, self.depth
        return (*encoder_layer_linears(h, i, d),
                TowerLinear(name="linear", in_features=h, out_features=self.out_hidden_size, count=1, part="merger"))



def paligemma_tower_from_config(cfg: dict[str, Any], name: str) -> PaliGemmaTowerSpec:
    """The PaliGemmaTowerSpec of a paligemma config.json dict; keys it omits take the config classes' defaults."""
    raw = cfg.get("vision_config")
    if raw is not None and not isinstance(raw, dict):
        raise SpecError(f"model {name}: vision_config must be an object, got {type(raw).__name__}")
    if raw is not None and raw.get("model_type", "siglip_vision_model") != "siglip_vision_model":
        raise SpecError(f"model {name}: paligemma's vision_config.model_type {raw.get('model_type')!r} is not "
                        "modelled; hpcmem models paligemma with a SigLIP tower (siglip_vision_model)")
    vc = {**SIGLIP_DEFAULTS, **(raw if raw is not None else PALIGEMMA_VISION_DEFAULTS)}
    for key in ("image_size", "patch_size"):
        if isinstance(vc[key], (list, tuple)):
            raise SpecError(f"model {name}: vision_config.{key} {vc[key]!r}: hpcmem models square images (an integer)")
    width = text_width(cfg, PALIGEMMA_TEXT_HIDDEN)
    projection = cfg.get("projection_dim", PROJECTION_DIM)
    if projection != width:
        raise SpecError(f"model {name}: projection_dim {projection!r} must equal text_config.hidden_size {width!r}: "
                        "PaliGemmaModel.get_placeholder_mask scatters the projector's output into the token embeddings")
    return PaliGemmaTowerSpec(model_type="paligemma", depth=vc["num_hidden_layers"], hidden_size=vc["hidden_size"],
                              intermediate_size=vc["intermediate_size"], num_heads=vc["num_attention_heads"],
                              in_channels=vc["num_channels"], image_size=vc["image_size"], patch_size=vc["patch_size"],
                              out_hidden_size=projection, hidden_act=str(vc["hidden_act"]),
                              pooling_head=bool(vc.get("vision_use_head")))

"""VipLlavaTowerSpec: ViP-LLaVA's CLIP tower (llava's, hpcmem.models.clip_tower) and its projector, which reads
several layers' outputs concatenated and normalizes them first.

transformers 5.24 models/vipllava/modular_vipllava.py: `VipLlavaModel(LlavaModel)` keeps llava's `vision_tower` (a
CLIPVisionModel) and decoder; `VipLlavaModel.get_image_features` takes `hidden_states[k][:, 1:]` (the class token
always dropped: there is no vision_feature_select_strategy) for every k of `vision_feature_layer` (a list, or one
integer) and `torch.cat`s them on the feature axis; `VipLlavaMultiModalProjector`: `projector_layernorm` (a LayerNorm
over layers × tower width, eps `projector_layernorm_eps`) → linear_1 (layers × tower width → text width) →
`projector_hidden_act` → linear_2 (text width → text width), both linears always with bias.

The tower runs every layer; the loss reaches the layers up to the deepest one a feature index names (with the
default (-2, -5, -8, -11, 6) on 24 layers: 23), the rest and post_layernorm get no gradient, as for llava.

configuration_vipllava.py `VipLlavaConfig`: vision_feature_layer (-2, -5, -8, -11, 6), projector_hidden_act gelu,
image_seq_length 576, tie_word_embeddings False (no text_config flag forwarded), and llava's CLIP ViT-L/14-336 for an
omitted vision_config. Its processor is LlavaProcessor (models/auto/processing_auto.py) with CLIPImageProcessor.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from hpcmem.errors import Problems, SpecError
from hpcmem.models.clip_tower import ClipTowerSpec, clip_tower_from_config
from hpcmem.models.tower_base import TowerLinear

# VipLlavaConfig's own defaults
VIPLLAVA_FEATURE_LAYERS = (-2, -5, -8, -11, 6)


@dataclass(frozen=True, kw_only=True)
class VipLlavaTowerSpec(ClipTowerSpec):
    """llava's CLIP tower; the projector reads `feature_layers` (hidden_states indices, 0 the embeddings) without
    their class tokens, concatenated, through a LayerNorm and two linears; `feature_layer` is the deepest of them,
    which sets the layers on the loss's path (ClipTowerSpec.trained_layers)."""

    feature_layers: tuple[int, ...]

    def __post_init__(self) -> None:
        super().__post_init__()
        p = Problems()
        for k in self.feature_layers:
            p.check(-self.depth <= k <= self.depth and k != 0,
                    f"vision_feature_layer {k} must pick a layer's output: -{self.depth}..-1 or 1..{self.depth} "
                    "(hpcmem models feature layers, not the embeddings)")
        p.raise_if_any()

    @property
    def concat_width(self) -> int:
        """The projector's input width: the tower width × the feature layers (`num_feature_layers`)."""
        return self.hidden_size * len(self.feature_layers)

    def linears(self) -> tuple[TowerLinear, ...]:
        tower = tuple(x for x in super().linears() if x.part == "tower")
        o = self.out_hidden_size
        return (*tower, TowerLinear(name="linear_1", in_features=self.concat_width, out_features=o, count=1,
                                    part="merger"),
                TowerLinear(name="linear_2", in_features=o, out_features=o, count=1, part="merger"))

    @property
    def merger_params(self) -> int:
        """`projector_layernorm` (weight and bias over the concatenated width) and the two linears."""
        return 2 * self.concat_width + super().merger_params


def vipllava_tower_from_config(cfg: dict[str, Any], name: str) -> VipLlavaTowerSpec:
    """The VipLlavaTowerSpec of a vipllava config.json dict; keys it omits take VipLlavaConfig's and
    CLIPVisionConfig's defaults (llava's, hpcmem.models.clip_tower)."""
    layers = cfg.get("vision_feature_layer", cfg.get("vision_feature_layers", VIPLLAVA_FEATURE_LAYERS))
    if isinstance(layers, int) and not isinstance(layers, bool):
        layers = (layers,)
    if not isinstance(layers, (list, tuple)) or not layers or \
            not all(isinstance(k, int) and not isinstance(k, bool) for k in layers):
        raise SpecError(f"model {name}: vision_feature_layer {layers!r} must be an integer or a list of integers")
    # llava's reader, the class token dropped and biases on as VipLlavaModel.get_image_features and
    # VipLlavaMultiModalProjector have them whatever the config says; `feature_layer` the deepest of the layers
    outer = {k: v for k, v in cfg.items() if k not in ("vision_feature_select_strategy", "multimodal_projector_bias")}
    base = clip_tower_from_config({**outer, "vision_feature_layer": -1}, name, model_type="vipllava")
    deepest = max(layers, key=lambda k: k if k > 0 else base.depth + 1 + k)
    return VipLlavaTowerSpec(**{f.name: getattr(base, f.name) for f in fields(base) if f.init
                                and f.name != "feature_layer"}, feature_layer=deepest, feature_layers=tuple(layers))

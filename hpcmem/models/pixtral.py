"""PixtralTowerSpec: Mistral 3's vision tower (Pixtral), its multimodal projector and its image geometry, as a
mistral3 config.json's `vision_config` and outer keys describe them.

transformers 5.24 models/mistral3/configuration_mistral3.py `Mistral3Config`: its vision_config a `pixtral`
(sub_configs_defaults init_kwargs when omitted: width 1024, MLP 4096, 24 layers, 16 heads, 14 px patches, image_size
1540, gelu), a mistral text_config, vision_feature_layer -1, projector gelu without bias, spatial_merge_size 2.
models/pixtral/modeling_pixtral.py `PixtralVisionModel`: `patch_conv` (a Conv2d without bias), `ln_pre`
(PixtralRMSNorm), `depth` `PixtralAttentionLayer`s (attention_norm → q/k/v/o_proj without bias, 2D axial rotary,
attention over one sequence of every image's patches with a block-diagonal mask → ffn_norm → gated MLP
gate/up/down_proj without bias, act_fn(gate) · up), no class token, no position table, no post-norm.
models/mistral3/modeling_mistral3.py `Mistral3MultiModalProjector`: `norm` (Mistral3RMSNorm over the tower width),
`patch_merger` (Mistral3PatchMerger: each image's grid unfolded in spatial_merge_size² blocks, `merging_layer`
Linear(merge²·width → width, no bias)), linear_1 (width → text width) → `projector_hidden_act` → linear_2 (text width
→ text width), with bias when `multimodal_projector_bias`. `get_image_features` reads hidden_states[-1]: every layer
is on the loss's path.

The processor (models/pixtral/processing_pixtral.py `PixtralProcessor`, image_processing_pil_pixtral.py
`PixtralImageProcessorPil`): each image scaled down (aspect kept, floor) to fit `longest_edge` on both sides, then each
side rounded up to a multiple of patch_size · spatial_merge_size (`get_resize_output_image_size` with the processor's
`patch_size · spatial_merge_size`, `_process_images`); its image tokens are rows · cols [IMG] (rows, cols the sides /
(patch_size · merge)), one [IMG_BREAK] after each row, the last one replaced by [IMG_END] (`replace_image_token`).
Mistral-Small-3.1's preprocessor names longest_edge 1540, its vision_config's image_size: hpcmem takes the processor's
longest_edge to be vision_config.image_size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from hpcmem.errors import Problems, SpecError
from hpcmem.models.tower_base import (LinearTower, TowerLinear, check_activation, check_counts, check_heads,
                                      text_width)

# Mistral3Config's sub_configs_defaults init_kwargs for an omitted vision_config, over PixtralVisionConfig's class
# defaults (models/pixtral/configuration_pixtral.py)
PIXTRAL_DEFAULTS: dict[str, Any] = {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24,
                                    "num_attention_heads": 16, "num_channels": 3, "image_size": 1024,
                                    "patch_size": 16, "hidden_act": "gelu"}
MISTRAL3_VISION_DEFAULTS: dict[str, Any] = {"intermediate_size": 4096, "hidden_size": 1024, "patch_size": 14,
                                            "image_size": 1540, "num_hidden_layers": 24, "num_attention_heads": 16,
                                            "hidden_act": "gelu"}
# Mistral3Config's own defaults
MISTRAL3_DEFAULTS: dict[str, Any] = {"vision_feature_layer": -1, "projector_hidden_act": "gelu",
                                     "multimodal_projector_bias": False, "spatial_merge_size": 2}
# Mistral3Config's sub_configs_defaults init_kwargs for an omitted text_config (the decoder's shape)
MISTRAL3_TEXT_DEFAULTS: dict[str, Any] = {"model_type": "mistral", "head_dim": 128, "hidden_act": "silu",
                                          "hidden_size": 5120, "intermediate_size": 32768,
                                          "max_position_embeddings": 131072, "num_attention_heads": 32,
                                          "num_hidden_layers": 40, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
                                          "rope_theta": 1000000000.0, "sliding_window": None, "vocab_size": 131072}
MISTRAL_HIDDEN = MISTRAL3_TEXT_DEFAULTS["hidden_size"]
# the gated MLP's activations whose saved tensors hpcmem.estimate derives (act_fn(gate) keeps its input for each)
PIXTRAL_ACTIVATIONS = ("gelu", "silu")


def pixtral_resize(height: int, width: int, longest_edge: int, step: int) -> tuple[int, int]:
    """image_processing_pil_pixtral.py `get_resize_output_image_size`, line for line: scaled down (floor, aspect kept)
    when a side exceeds longest_edge, then each side rounded up to a multiple of `step` (`_num_image_tokens`)."""
    ratio = max(height / longest_edge, width / longest_edge)
    if ratio > 1:
        height, width = int(math.floor(height / ratio)), int(math.floor(width / ratio))
    return ((height - 1) // step + 1) * step, ((width - 1) // step + 1) * step


@dataclass(frozen=True, kw_only=True)
class PixtralTowerSpec(LinearTower):
    """A Pixtral tower and Mistral 3's projector (hidden_size the tower width, out_hidden_size the text width)."""

    image_size: int             # the processor's longest_edge (vision_config.image_size)
    spatial_merge_size: int
    projector_act: str
    projector_bias: bool
    norm: str = "rms"
    mlp: str = "gated"
    family: str = "pixtral"
    fixed_resolution: bool = False
    deepstack_visual_indexes: tuple[int, ...] = ()
    # the projector reads hidden_states[-1], which `get_image_features` asks the tower to record for every layer
    # (`select_hidden_states`: output_hidden_states); a tower read through last_hidden_state records none
    records_hidden_states: bool = True

    def __post_init__(self) -> None:
        p = Problems()
        check_counts(p, self, ("depth", "hidden_size", "intermediate_size", "num_heads", "in_channels", "image_size",
                               "patch_size", "out_hidden_size", "spatial_merge_size"))
        check_activation(p, self.hidden_act, PIXTRAL_ACTIVATIONS)
        p.check(self.projector_act == "gelu",
                f"projector_hidden_act {self.projector_act!r}: what it keeps for backward is derived only for gelu")
        p.raise_if_any()
        check_heads(p, self.hidden_size, self.num_heads, "num_attention_heads")
        p.raise_if_any()

    @property
    def merge_unit(self) -> int:
        return self.spatial_merge_size ** 2

    @property
    def step(self) -> int:
        """The processor's resize step: patch_size · spatial_merge_size (PixtralProcessor `_process_images`)."""
        return self.patch_size * self.spatial_merge_size

    def grid(self, height: int, width: int) -> tuple[int, int]:
        """(rows, cols) of one image's patches after the processor's resize."""
        h, w = pixtral_resize(height, width, self.image_size, self.step)
        return h // self.patch_size, w // self.patch_size

    def merged_tokens(self, height: int, width: int) -> int:
        """Rows the patch merger makes of one image: its grid unfolded in merge × merge blocks (torch's `unfold`
        drops a last odd row or column of patches)."""
        rows, cols = self.grid(height, width)
        return (rows // self.spatial_merge_size) * (cols // self.spatial_merge_size)

    def image_tokens(self, height: int, width: int) -> int:
        """[IMG], [IMG_BREAK] and [IMG_END] tokens of one image: a row of cols / merge [IMG] and one break per merged
        row (the last one the end token)."""
        rows, cols = self.grid(height, width)
        return (rows // self.spatial_merge_size) * (cols // self.spatial_merge_size + 1)

    def linears(self) -> tuple[TowerLinear, ...]:
        h, i, d, o = self.hidden_size, self.intermediate_size, self.depth, self.out_hidden_size
        attention = tuple(TowerLinear(name=f"attention.{n}", in_features=h, out_features=h, count=d, part="tower",
                                      bias=False) for n in ("q_proj", "k_proj", "v_proj", "o_proj"))
        mlp = (TowerLinear(name="feed_forward.gate_proj", in_features=h, out_features=i, count=d, part="tower",
                           bias=False),
               TowerLinear(name="feed_forward.up_proj", in_features=h, out_features=i, count=d, part="tower",
                           bias=False),
               TowerLinear(name="feed_forward.down_proj", in_features=i, out_features=h, count=d, part="tower",
                           bias=False))
        b = self.projector_bias
        projector = (TowerLinear(name="patch_merger.merging_layer", in_features=h * self.merge_unit, out_features=h,
                                 count=1, part="merger", bias=False),
                     TowerLinear(name="linear_1", in_features=h, out_features=o, count=1, part="merger", bias=b),
                     TowerLinear(name="linear_2", in_features=o, out_features=o, count=1, part="merger", bias=b))
        return (*attention, *mlp, *projector)

    @property
    def block_params(self) -> int:
        """One PixtralAttentionLayer: its seven linears and two RMSNorms (a weight each)."""
        linear = sum(x.params for x in self.linears() if x.part == "tower")
        return linear // self.depth + 2 * self.hidden_size

    @property
    def embed_params(self) -> int:
        """patch_conv (no bias) and ln_pre (a weight); the rotary tables are buffers."""
        return self.patch_dim * self.hidden_size + self.hidden_size

    @property
    def tower_params(self) -> int:
        return self.embed_params + self.block_params * self.depth

    @property
    def merger_params(self) -> int:
        """The projector's RMSNorm over the tower width and its three linears."""
        return self.hidden_size + sum(x.params for x in self.linears() if x.part == "merger")


def pixtral_vision_values(cfg: dict[str, Any], name: str, model_type: str,
                          omitted: dict[str, Any]) -> dict[str, Any]:
    """The Pixtral vision_config of a config.json dict over PixtralVisionConfig's class defaults; `omitted`: what the
    outer config class builds when the config.json names no vision_config (its sub_configs_defaults)."""
    raw = cfg.get("vision_config")
    if raw is not None and not isinstance(raw, dict):
        raise SpecError(f"model {name}: vision_config must be an object, got {type(raw).__name__}")
    if raw is not None and raw.get("model_type", "pixtral") != "pixtral":
        raise SpecError(f"model {name}: {model_type}'s vision_config.model_type {raw.get('model_type')!r} is not "
                        f"modelled; hpcmem models {model_type} with a Pixtral tower (pixtral)")
    vc = {**PIXTRAL_DEFAULTS, **(raw if raw is not None else omitted)}
    for key in ("image_size", "patch_size"):
        if isinstance(vc[key], (list, tuple)):
            raise SpecError(f"model {name}: vision_config.{key} {vc[key]!r}: hpcmem models one integer (the "
                            "processor's longest_edge, a square patch)")
    return vc


def pixtral_tower_from_config(cfg: dict[str, Any], name: str) -> PixtralTowerSpec:
    """The PixtralTowerSpec of a mistral3 config.json dict; keys it omits take the config classes' defaults."""
    return pixtral_spec(cfg, name, "mistral3", MISTRAL3_VISION_DEFAULTS, MISTRAL_HIDDEN)


def pixtral_spec(cfg: dict[str, Any], name: str, model_type: str, omitted: dict[str, Any],
                 text_hidden: int) -> PixtralTowerSpec:
    """The PixtralTowerSpec of a config.json dict of a type built on Mistral3Config's outer keys (`omitted`: the
    vision_config its class builds when none is named; `text_hidden`: the text width of an omitted text_config)."""
    vc = pixtral_vision_values(cfg, name, model_type, omitted)
    outer = {**MISTRAL3_DEFAULTS, **{k: cfg[k] for k in MISTRAL3_DEFAULTS if k in cfg}}
    if outer["vision_feature_layer"] != -1:
        # get_image_features reads hidden_states[vision_feature_layer]; a list concatenates several layers
        raise SpecError(f"model {name}: vision_feature_layer {outer['vision_feature_layer']!r}: hpcmem models "
                        f"{model_type} reading the last layer's output (-1, Mistral3Config's default)")
    width = text_width(cfg, text_hidden)
    return PixtralTowerSpec(
        model_type=model_type, depth=vc["num_hidden_layers"], hidden_size=vc["hidden_size"],
        intermediate_size=vc["intermediate_size"], num_heads=vc["num_attention_heads"], in_channels=vc["num_channels"],
        image_size=vc["image_size"], patch_size=vc["patch_size"], out_hidden_size=width,
        hidden_act=str(vc["hidden_act"]), spatial_merge_size=outer["spatial_merge_size"],
        projector_act=str(outer["projector_hidden_act"]), projector_bias=bool(outer["multimodal_projector_bias"]))

"""Inkling2TowerSpec: Inkling 2's (model_type "inkling2") vision tower and its patch merger (transformers 5.24
models/inkling2/).

- The config (configuration_inkling2.py): `Inkling2Config.sub_configs_defaults` builds an omitted `vision_config` as
  `Inkling2VisionConfig` (Step3p7VisionConfig's fields at width 1024, 23 layers, 16 heads, 20 px patches, gelu,
  LayerNorm eps 1e-5, intermediate_size = int(width · mlp_ratio) = 4096 when unset, layer scale 0.1, axial rope,
  spatial_merge_size 2, a 32 × 32 learned position grid, projection_hidden_dim 4096, projector_bias False,
  text_hidden_size 4608) and an omitted `text_config` as `Inkling2TextConfig` (model_type "inkling2_text", learned:
  hpcmem.models.vlm_learned); `validate_architecture` requires text_hidden_size = text_config.hidden_size.
- The tower (modeling_inkling2.py `Inkling2VisionModel`): `Inkling2VisionEmbeddings` (an nn.Linear patch embedding
  without bias over each 20 × 20 × 3 patch, the 32² position table interpolated bilinearly to each image's patch grid
  by `get_vision_interpolation_indices_and_weights`, a class token per image in front of its patches:
  class_embedding + cls_position_embedding), `pre_layernorm`, `num_hidden_layers` `Inkling2VisionEncoderLayer`s
  (Step3p7VisionEncoderLayer's: layernorm_before → q/k/v/out_proj with biases, the axial rope on q and k, attention
  per image → × lambda_1 → residual; layernorm_after → fc1 → gelu → fc2 → × lambda_2 → residual), no post-norm; then
  `Inkling2VisionMerger` on the patches' rows (the class tokens dropped), each 2 × 2 block's four rows concatenated:
  linear_1 (4 · width → projection_hidden_dim) → gelu → linear_2 (→ text_hidden_size), biases when projector_bias.
- The processor (image_processing_inkling2.py `Inkling2ImageProcessor`, size 40 × 40, no resize; processing_inkling2.py
  `Inkling2Processor`): each image padded up to whole 40 px cells (`_preprocess`: rows = ⌈height / 40⌉, columns =
  ⌈width / 40⌉), one pixel_values row [40, 40, 3] and one image token per cell (`replace_image_token`:
  image_grid_thw.prod() tokens, no markers); the tower cuts each cell into merge² = 4 native patches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from hpcmem.errors import Problems, SpecError
from hpcmem.models.tower_base import (LinearTower, TowerLinear, check_activation, check_counts, check_heads,
                                      encoder_layer_linears, text_width, vision_values)

# configuration_inkling2.py `Inkling2VisionConfig`'s field defaults (intermediate_size None: width · mlp_ratio)
INKLING2_VISION_DEFAULTS: dict[str, Any] = {
    "hidden_size": 1024, "intermediate_size": None, "num_hidden_layers": 23, "num_attention_heads": 16,
    "num_channels": 3, "patch_size": 20, "hidden_act": "gelu", "mlp_ratio": 4.0, "spatial_merge_size": 2,
    "posemb_grid_size": 32, "projection_hidden_dim": 4096, "projector_bias": False, "text_hidden_size": 4608,
    "rope_parameters": None}
INKLING2_TEXT_HIDDEN = 4608     # Inkling2TextConfig.hidden_size: the text width of an omitted text_config
INKLING2_CELL = 40              # `Inkling2ImageProcessor.size` {"height": 40, "width": 40}: one image token's cell
INKLING2_ACTIVATIONS = ("gelu",)


def inkling2_grid(height: int, width: int, cell: int = INKLING2_CELL) -> tuple[int, int]:
    """(rows, columns) of image tokens of one image: image_processing_inkling2.py `Inkling2ImageProcessor._preprocess`
    (`math.ceil(height / size.height)`, `math.ceil(width / size.width)`: the image padded up to whole cells)."""
    return math.ceil(height / cell), math.ceil(width / cell)


@dataclass(frozen=True, kw_only=True)
class Inkling2TowerSpec(LinearTower):
    """A ViT run over each image's own patch grid with a class token per image (no fixed resolution), its patches'
    rows merged 2 × 2 into the merger. `position_side` is the learned position grid's side (posemb_grid_size)."""

    spatial_merge_size: int
    position_side: int
    projector_hidden: int       # projection_hidden_dim: linear_1's output
    projector_bias: bool
    text_first_layer: str = "hybrid_sliding"    # text_config.layer_types[0] (hpcmem.estimate.vision_inkling2_text)
    cell: int = INKLING2_CELL
    projector_act: str = "gelu"
    norm: str = "layer"         # torch LayerNorms (hpcmem.estimate.vision `block_saved`)
    mlp: str = "fc"             # fc2(gelu(fc1 x))
    family: str = "inkling2"
    image_size: int = 0         # no resize (hpcmem.job.images): the processor pads to whole cells
    fixed_resolution: bool = False
    hooked_input: bool = False  # Inkling2VisionModel names no input embeddings
    deepstack_visual_indexes: tuple[int, ...] = ()
    activations: ClassVar[tuple[str, ...]] = INKLING2_ACTIVATIONS
    reads_last_hidden_state: ClassVar[bool] = True

    def __post_init__(self) -> None:
        p = Problems()
        check_counts(p, self, ("depth", "hidden_size", "intermediate_size", "num_heads", "in_channels", "patch_size",
                               "spatial_merge_size", "position_side", "projector_hidden", "out_hidden_size"))
        check_activation(p, self.hidden_act, self.activations)
        p.raise_if_any()
        check_heads(p, self.hidden_size, self.num_heads, "num_attention_heads")
        p.check((self.hidden_size // self.num_heads) % 4 == 0,
                f"vision_config head_dim {self.hidden_size // self.num_heads} must be a multiple of 4: the axial rope "
                "rotates pairs of each half (Inkling2VisionRotaryEmbedding)")
        p.check(self.patch_size * self.spatial_merge_size == self.cell,
                f"vision_config.patch_size {self.patch_size} × spatial_merge_size {self.spatial_merge_size} must be "
                f"{self.cell}: Inkling2ImageProcessor's cell (size 40 × 40), which Inkling2VisionEmbeddings cuts into "
                "merge² patches")
        p.raise_if_any()

    @property
    def merge_unit(self) -> int:
        return self.spatial_merge_size ** 2

    @property
    def merged_width(self) -> int:
        """linear_1's input: spatial_merge_size² · width (`Inkling2VisionModel.forward`'s reshape)."""
        return self.hidden_size * self.merge_unit

    def linears(self) -> tuple[TowerLinear, ...]:
        """Every nn.Linear (peft's "all-linear" wraps each): the encoder layers' (`vision_tower.layers.N.self_attn.
        q/k/v/out_proj`, `mlp.fc1`, `mlp.fc2`, all with bias), the patch embedding (`vision_tower.embeddings.
        patch_embedding`, no bias, part "embed") and the merger's (`vision_tower.merger.linear_1`, `linear_2`)."""
        h, i, d, b = self.hidden_size, self.intermediate_size, self.depth, self.projector_bias
        return (*encoder_layer_linears(h, i, d),
                TowerLinear(name="patch_embedding", in_features=self.patch_dim, out_features=h, count=1, part="embed",
                            bias=False),
                TowerLinear(name="linear_1", in_features=self.merged_width, out_features=self.projector_hidden,
                            count=1, part="merger", bias=b),
                TowerLinear(name="linear_2", in_features=self.projector_hidden, out_features=self.out_hidden_size,
                            count=1, part="merger", bias=b))

    @property
    def block_params(self) -> int:
        """One encoder layer: its six linears, two LayerNorms (weight and bias), lambda_1 and lambda_2."""
        linear = sum(x.params for x in self.linears() if x.part == "tower")
        return linear // self.depth + 6 * self.hidden_size

    @property
    def embed_params(self) -> int:
        """patch_embedding (no bias), the position table (position_side² rows), class_embedding and
        cls_position_embedding."""
        h = self.hidden_size
        return self.patch_dim * h + self.position_side ** 2 * h + 2 * h

    @property
    def tower_params(self) -> int:
        """Inkling2VisionModel without its merger: embeddings, pre_layernorm, the encoder layers."""
        return self.embed_params + 2 * self.hidden_size + self.depth * self.block_params

    def grid(self, height: int, width: int) -> tuple[int, int]:
        return inkling2_grid(height, width, self.cell)

    def image_tokens(self, height: int, width: int) -> int:
        """Image tokens of one image: its cells (`Inkling2Processor.replace_image_token`: image_grid_thw.prod())."""
        rows, cols = self.grid(height, width)
        return rows * cols

    def image_patches(self, height: int, width: int) -> int:
        """Native patches of one image: merge² per cell (the class token is the tower's own row besides)."""
        return self.image_tokens(height, width) * self.merge_unit


def inkling2_tower_from_config(cfg: dict[str, Any], name: str) -> Inkling2TowerSpec:
    """The Inkling2TowerSpec of an inkling2 config.json dict; keys it omits take the config classes' defaults, the
    processor's cell Inkling2ImageProcessor's class default."""
    vc = vision_values(cfg, name, INKLING2_VISION_DEFAULTS)
    rope = vc["rope_parameters"] or {"rope_type": "axial"}
    if not isinstance(rope, dict) or rope.get("rope_type", "axial") != "axial":
        raise SpecError(f"model {name}: vision_config.rope_parameters {vc['rope_parameters']!r}: "
                        "Inkling2VisionRotaryEmbedding supports only rope_type 'axial'")
    text = text_width(cfg, INKLING2_TEXT_HIDDEN)
    if vc["text_hidden_size"] != text:
        raise SpecError(f"model {name}: vision_config.text_hidden_size {vc['text_hidden_size']!r} must equal "
                        f"text_config.hidden_size {text!r} (Inkling2Config.validate_architecture)")
    text_cfg = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {}
    layer_types = text_cfg.get("layer_types")
    # Inkling2TextConfig.__post_init__'s default: "hybrid" every sixth layer, so layer 0 is "hybrid_sliding"
    first = str(layer_types[0]) if isinstance(layer_types, list) and layer_types else "hybrid_sliding"
    inner = vc["intermediate_size"]
    if inner is None:
        inner = int(vc["hidden_size"] * vc["mlp_ratio"])
    return Inkling2TowerSpec(
        model_type="inkling2", depth=vc["num_hidden_layers"], hidden_size=vc["hidden_size"], intermediate_size=inner,
        num_heads=vc["num_attention_heads"], in_channels=vc["num_channels"], patch_size=vc["patch_size"],
        out_hidden_size=text, hidden_act=str(vc["hidden_act"]), spatial_merge_size=vc["spatial_merge_size"],
        position_side=vc["posemb_grid_size"], projector_hidden=vc["projection_hidden_dim"],
        projector_bias=bool(vc["projector_bias"]), text_first_layer=first)

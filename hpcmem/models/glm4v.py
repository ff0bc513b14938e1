"""Glm4vTowerSpec: GLM-4.1V's (model_type "glm4v"; "glm46v" and "glmga" build the same classes) vision tower and
patch merger, as its config.json's `vision_config` describes them, their linear layers and parameter count
(transformers 5.24 models/glm4v/modeling_glm4v.py). Not yet wired into hpcmem.models.vision: the type stays refused
until the tower's activations are derived and traced.

- `Glm4vVisionModel.__init__`: `patch_embed` a Conv3d (in_channels → hidden_size, kernel temporal_patch_size ×
  patch_size², bias), `embeddings` an nn.Embedding of (image_size / patch_size)² rows (the position table
  `Glm4vVisionEmbeddings.forward` resamples per image), `post_conv_layernorm`, `post_layernorm` (RMSNorms), `downsample`
  a Conv2d (hidden_size → out_hidden_size, kernel spatial_merge_size, bias), `merger`.
- `Glm4vVisionBlock`: norm1, norm2 (RMSNorm), `attn.qkv` (bias: config.attention_bias), `attn.proj` (no bias),
  `Glm4VisionMlp(bias=False)` gate/up/down_proj whose width is out_hidden_size (`self.intermediate_size =
  config.out_hidden_size`), not intermediate_size.
- `Glm4vVisionPatchMerger(dim=out_hidden_size, context_dim=intermediate_size, bias=False)`: proj, post_projection_norm
  (LayerNorm, weight and bias), gate/up/down_proj at intermediate_size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpcmem.errors import SpecError
from hpcmem.models.tower_base import TowerBase, TowerLinear, grid_patches

# configuration_glm4v.py `Glm4vVisionConfig` field defaults (the GLM-4.1V-9B tower)
GLM4V_VISION_DEFAULTS: dict[str, Any] = {
    "depth": 24, "hidden_size": 1536, "hidden_act": "silu", "attention_bias": False, "num_heads": 12,
    "in_channels": 3, "image_size": 336, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2,
    "out_hidden_size": 4096, "intermediate_size": 13696}


@dataclass(frozen=True, kw_only=True)
class Glm4vTowerSpec(TowerBase):
    """GLM-4.1V's tower: `hidden_size` its width, `out_hidden_size` the block MLP's and the merger's width (the text
    width), `intermediate_size` the merger's gated MLP."""

    image_size: int
    spatial_merge_size: int
    temporal_patch_size: int
    attention_bias: bool = False
    family: str = "glm4v"

    @property
    def patch_dim(self) -> int:
        """Values per patch row of pixel_values: in_channels × temporal_patch_size × patch_size² (the Conv3d)."""
        return self.in_channels * self.temporal_patch_size * self.patch_size ** 2

    def linears(self) -> tuple[TowerLinear, ...]:
        h, o, i, d = self.hidden_size, self.out_hidden_size, self.intermediate_size, self.depth
        return (TowerLinear(name="attn.qkv", in_features=h, out_features=3 * h, count=d, part="tower",
                            bias=self.attention_bias),
                TowerLinear(name="attn.proj", in_features=h, out_features=h, count=d, part="tower", bias=False),
                TowerLinear(name="mlp.gate_proj", in_features=h, out_features=o, count=d, part="tower", bias=False),
                TowerLinear(name="mlp.up_proj", in_features=h, out_features=o, count=d, part="tower", bias=False),
                TowerLinear(name="mlp.down_proj", in_features=o, out_features=h, count=d, part="tower", bias=False),
                TowerLinear(name="proj", in_features=o, out_features=o, count=1, part="merger", bias=False),
                TowerLinear(name="gate_proj", in_features=o, out_features=i, count=1, part="merger", bias=False),
                TowerLinear(name="up_proj", in_features=o, out_features=i, count=1, part="merger", bias=False),
                TowerLinear(name="down_proj", in_features=i, out_features=o, count=1, part="merger", bias=False))

    @property
    def tower_params(self) -> int:
        """Patch embedding (Conv3d with bias), position table, the blocks (linears and two RMSNorms each),
        post_conv_layernorm, post_layernorm and the downsample Conv2d (with bias)."""
        h, o, s = self.hidden_size, self.out_hidden_size, self.spatial_merge_size
        embed = self.patch_dim * h + h + grid_patches(self.image_size, self.patch_size) * h
        blocks = sum(x.params for x in self.linears() if x.part == "tower") + 2 * h * self.depth
        return embed + blocks + 2 * h + h * o * s * s + o

    @property
    def merger_params(self) -> int:
        """The merger's linears and its LayerNorm (weight and bias) over out_hidden_size."""
        return sum(x.params for x in self.linears() if x.part == "merger") + 2 * self.out_hidden_size

    @property
    def num_params(self) -> int:
        return self.tower_params + self.merger_params


def glm4v_tower_from_config(cfg: dict[str, Any], name: str) -> Glm4vTowerSpec:
    """The Glm4vTowerSpec of a glm4v / glm46v / glmga config.json dict; keys vision_config omits take
    Glm4vVisionConfig's defaults."""
    raw = cfg.get("vision_config")
    if raw is not None and not isinstance(raw, dict):
        raise SpecError(f"model {name}: vision_config must be an object, got {type(raw).__name__}")
    vc = {**GLM4V_VISION_DEFAULTS, **(raw or {})}
    if isinstance(vc["image_size"], (list, tuple)):
        raise SpecError(f"model {name}: vision_config.image_size {vc['image_size']!r}: hpcmem reads a square "
                        "position table (an integer)")
    return Glm4vTowerSpec(model_type=str(cfg.get("model_type", "glm4v")), depth=vc["depth"],
                          hidden_size=vc["hidden_size"], intermediate_size=vc["intermediate_size"],
                          num_heads=vc["num_heads"], in_channels=vc["in_channels"], patch_size=vc["patch_size"],
                          out_hidden_size=vc["out_hidden_size"], hidden_act=str(vc["hidden_act"]),
                          image_size=vc["image_size"], spatial_merge_size=vc["spatial_merge_size"],
                          temporal_patch_size=vc["temporal_patch_size"],
                          attention_bias=bool(vc["attention_bias"]))

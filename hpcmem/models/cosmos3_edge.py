"""Cosmos3EdgeTowerSpec: Cosmos3 Edge's (model_type "cosmos3_edge") packed SigLIP2 tower and its 2 × 2 patch merger
(transformers 5.24 models/cosmos3_edge/modular_cosmos3_edge.py).

- The config: `Cosmos3EdgeConfig.sub_configs_defaults` builds an omitted `vision_config` as `Cosmos3EdgeVisionConfig`
  (Siglip2VisionConfig's fields: width 1152, MLP 4304, 27 layers, 16 heads, num_channels 3, patch_size 16,
  gelu_pytorch_tanh, layer_norm_eps 1e-6; num_patches 256: a 16 × 16 learned position grid; spatial_merge_size 2;
  no pooling head) and an omitted `text_config` as `Cosmos3EdgeTextConfig` (LlamaConfig's shape with a two-linear
  ReLU² MLP fc1/fc2 and M-RoPE, width 2048: learned, hpcmem.models.vlm_learned); projector_hidden_size 11520,
  tie_word_embeddings False.
- The tower (`Cosmos3EdgeVisionModel`): `Cosmos3EdgeVisionEmbeddings` (Siglip2VisionEmbeddings': `patch_embedding` an
  nn.Linear(3 · 16² → width, with bias) over the processor's flattened patches, plus the 16 × 16 position table
  resized bilinearly per image to its own patch grid, `resize_positional_embeddings`), `num_hidden_layers`
  `Cosmos3EdgeVisionEncoderLayer`s (Siglip2EncoderLayer's: layer_norm1 → q/k/v_proj → attention per image on the
  cu_seqlens splits, concatenated → out_proj → residual, layer_norm2 → mlp fc1 → gelu_pytorch_tanh → fc2 → residual,
  every linear with a bias), then `post_layernorm`: its output is last_hidden_state.
- The merger (`Cosmos3EdgePatchMerger`, Qwen3_5MoeVisionPatchMerger's forward without the post-shuffle norm): `norm` a
  LayerNorm over the tower width (eps 1e-6) on every patch, viewed [N / 4, 4 · width], linear_fc1 (→
  projector_hidden_size) → GELU → linear_fc2 (→ text width): one image token per 2 × 2 block.
- The processor (`Cosmos3EdgeImageProcessor(Glm4vImageProcessor)`, its PIL twin the same): GLM-4.1V's `smart_resize`
  with temporal_patch_size 1 (one frame), factor patch · merge = 32 and size {shortest_edge 256², longest_edge
  4096²} (hpcmem.models.glm4v `glm4v_resize`); `Cosmos3EdgeProcessor.replace_image_token` writes patches / merge²
  image tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from hpcmem.errors import Problems, SpecError
from hpcmem.models.glm4v import glm4v_resize
from hpcmem.models.siglip import SIGLIP_ACTIVATIONS
from hpcmem.models.tower_base import (TowerBase, TowerLinear, check_activation, check_counts, check_heads,
                                      encoder_layer_linears, text_width, vision_values)

# modular_cosmos3_edge.py `Cosmos3EdgeVisionConfig`'s field defaults (and Siglip2VisionConfig's it keeps)
COSMOS3_EDGE_VISION_DEFAULTS: dict[str, Any] = {
    "hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27, "num_attention_heads": 16,
    "num_channels": 3, "patch_size": 16, "hidden_act": "gelu_pytorch_tanh", "num_patches": 256,
    "spatial_merge_size": 2}
COSMOS3_EDGE_PROJECTOR_HIDDEN = 11520   # `Cosmos3EdgeConfig.projector_hidden_size`
COSMOS3_EDGE_TEXT_HIDDEN = 2048         # `Cosmos3EdgeTextConfig.hidden_size`: the text width of an omitted text_config
# `Cosmos3EdgeImageProcessor.size`: (shortest_edge, longest_edge) pixels, per frame (temporal_patch_size 1)
COSMOS3_EDGE_PIXELS = (256 * 256, 4096 * 4096)
TEMPORAL_PATCH = 1                      # `Cosmos3EdgeImageProcessor.temporal_patch_size`


@dataclass(frozen=True, kw_only=True)
class Cosmos3EdgeTowerSpec(TowerBase):
    """A SigLIP2 tower run over each image's own patch grid (no class token, no fixed resolution: GLM-4.1V's
    smart_resize, hpcmem.job.images), its rows merged 2 × 2 into the merger."""

    spatial_merge_size: int
    projector_hidden: int       # projector_hidden_size: linear_fc1's output
    position_side: int          # √num_patches: the learned position grid's side (Siglip2VisionEmbeddings)
    default_pixels: tuple[int, int] = COSMOS3_EDGE_PIXELS
    projector_act: str = "gelu"
    norm: str = "layer"         # torch LayerNorms (hpcmem.estimate.vision `block_saved`)
    mlp: str = "fc"             # SiglipMLP: fc2(act(fc1 x))
    family: str = "cosmos3_edge"
    image_size: int = 0         # no fixed resize (hpcmem.job.images): the processor's smart_resize
    fixed_resolution: bool = False
    hooked_input: bool = False  # Cosmos3EdgeVisionModel names no input embeddings
    deepstack_visual_indexes: tuple[int, ...] = ()
    activations: ClassVar[tuple[str, ...]] = SIGLIP_ACTIVATIONS
    reads_last_hidden_state: ClassVar[bool] = True

    def __post_init__(self) -> None:
        p = Problems()
        check_counts(p, self, ("depth", "hidden_size", "intermediate_size", "num_heads", "in_channels", "patch_size",
                               "spatial_merge_size", "projector_hidden", "position_side", "out_hidden_size"))
        check_activation(p, self.hidden_act, self.activations)
        p.raise_if_any()
        check_heads(p, self.hidden_size, self.num_heads, "num_attention_heads")
        p.raise_if_any()

    @property
    def patch_dim(self) -> int:
        """Values per pixel_values row: num_channels · patch² (temporal_patch_size 1; patch_embedding's input)."""
        return self.in_channels * self.patch_size ** 2

    @property
    def merge_unit(self) -> int:
        return self.spatial_merge_size ** 2

    @property
    def merged_width(self) -> int:
        """`Cosmos3EdgePatchMerger.hidden_size`: width · spatial_merge_size²."""
        return self.hidden_size * self.merge_unit

    def linears(self) -> tuple[TowerLinear, ...]:
        """Every nn.Linear (peft's "all-linear" wraps each): the encoder layers' (`visual.encoder.layers.N.self_attn.
        q/k/v/out_proj`, `mlp.fc1`, `mlp.fc2`, all with bias), the patch embedding (`visual.embeddings.
        patch_embedding`, part "embed") and the merger's (`projector.linear_fc1`, `projector.linear_fc2`)."""
        h, i, d = self.hidden_size, self.intermediate_size, self.depth
        return (*encoder_layer_linears(h, i, d),
                TowerLinear(name="patch_embedding", in_features=self.patch_dim, out_features=h, count=1, part="embed"),
                TowerLinear(name="linear_fc1", in_features=self.merged_width, out_features=self.projector_hidden,
                            count=1, part="merger"),
                TowerLinear(name="linear_fc2", in_features=self.projector_hidden, out_features=self.out_hidden_size,
                            count=1, part="merger"))

    @property
    def block_params(self) -> int:
        linear = sum(x.params for x in self.linears() if x.part == "tower")
        return linear // self.depth + 4 * self.hidden_size

    @property
    def merger_params(self) -> int:
        """The merger: `norm` over the tower width (weight and bias) and its two linears."""
        return 2 * self.hidden_size + sum(x.params for x in self.linears() if x.part == "merger")

    @property
    def embed_params(self) -> int:
        """patch_embedding (weight and bias) and the position table (position_side² rows)."""
        h = self.hidden_size
        return self.patch_dim * h + h + self.position_side ** 2 * h

    @property
    def tower_params(self) -> int:
        """Cosmos3EdgeVisionModel: embeddings, the encoder layers, post_layernorm."""
        return self.embed_params + self.depth * self.block_params + 2 * self.hidden_size

    @property
    def num_params(self) -> int:
        return self.tower_params + self.merger_params

    def resized(self, height: int, width: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
        """Glm4vImageProcessor's smart_resize for one frame (temporal_factor 1), factor patch · merge."""
        return glm4v_resize(height, width, self.patch_size * self.spatial_merge_size, TEMPORAL_PATCH, min_pixels,
                            max_pixels)


def cosmos3_edge_tower_from_config(cfg: dict[str, Any], name: str) -> Cosmos3EdgeTowerSpec:
    """The Cosmos3EdgeTowerSpec of a cosmos3_edge config.json dict; keys it omits take the config classes'
    defaults."""
    vc = vision_values(cfg, name, COSMOS3_EDGE_VISION_DEFAULTS)
    side = math.isqrt(int(vc["num_patches"]))
    if side * side != vc["num_patches"]:
        raise SpecError(f"model {name}: vision_config.num_patches {vc['num_patches']!r} is not a square (the learned "
                        "position grid is √num_patches a side: Siglip2VisionEmbeddings.position_embedding_size)")
    if vc["spatial_merge_size"] != 2:
        raise SpecError(f"model {name}: hpcmem models cosmos3_edge at spatial_merge_size 2 (Cosmos3EdgeVisionConfig's "
                        "default, the image processor's merge_size)")
    return Cosmos3EdgeTowerSpec(
        model_type="cosmos3_edge", depth=vc["num_hidden_layers"], hidden_size=vc["hidden_size"],
        intermediate_size=vc["intermediate_size"], num_heads=vc["num_attention_heads"],
        in_channels=vc["num_channels"], patch_size=vc["patch_size"], position_side=side,
        out_hidden_size=text_width(cfg, COSMOS3_EDGE_TEXT_HIDDEN), hidden_act=str(vc["hidden_act"]),
        spatial_merge_size=vc["spatial_merge_size"],
        projector_hidden=cfg.get("projector_hidden_size", COSMOS3_EDGE_PROJECTOR_HIDDEN))

"""MuseGlimmerTowerSpec: Muse Glimmer's (model_type "muse_glimmer") windowed NaViT tower, its vision adapter and
projection (transformers 5.24 models/muse_glimmer/).

- The config (configuration_muse_glimmer.py): `MuseGlimmerConfig.sub_configs_defaults` builds an omitted
  `vision_config` as `MuseGlimmerVisionConfig` (width 1536, MLP 8960, 50 layers, 16 heads, 14 px patches,
  patch_temporal 2, merge_size 2, a 32 × 32 learned position table, exact GELU, axial 2-D rope; layer_types full
  attention every 4th layer and the last, window attention otherwise) and an omitted `text_config` as
  `MuseGlimmerTextConfig` (Gemma 2's layer frame with gated, QK-normed attention, width 6656, vocab 202,048:
  learned, hpcmem.models.vlm_learned); out_hidden_size 6144 (width · merge²), projector_hidden_size 4096, GELU.
- The tower (modeling_muse_glimmer.py `MuseGlimmerVisionModel`): `MuseGlimmerVisionPatchEmbedder` (PaddleOCR-VL's
  embeddings reshaped: `patch_embedding` an nn.Linear(patch_temporal · 3 · 14² → width, no bias) over the
  processor's flattened patches, plus the 32 × 32 `position_embedding_table` (an nn.Embedding) resampled bilinearly
  per image by a weighted sum over 4 taps), `ln_pre`, the rows permuted into 32 × 32-patch windows
  (qwen2_5_vl's window index at spatial_merge_size 1), `num_hidden_layers` `MuseGlimmerVisionEncoderLayer`s (Kimi
  K2.5's: norm1 → q/k/v_proj → axial rope in fp32 → attention per window or per image on the cu_seqlens splits →
  proj, norm2 → fc1 → GELU → fc2; every linear with a bias; LayerNorms eps 1e-5), the rows put back, `ln_post`, then
  `pixel_shuffle`: each 2 × 2 block of rows folded into one [4 · width] row (no parameters).
- After the tower (`MuseGlimmerModel.get_image_features`): `vision_adapter` (fc1 out_hidden_size → projector_hidden,
  GELU, fc2 projector_hidden → projector_hidden, GELU; no biases), `vision_projection` (projector_hidden → text
  width, no bias) and `perception_emb_norm` (an RMSNorm without weight): one image token per 4 patches.
- The processor (image_processing_muse_glimmer.py `MuseGlimmerImageProcessor`, torchvision-only; max_image_tokens
  4096): `smart_resize` picks the whole grid of 28 px blocks (patch · merge) nearest the image's aspect ratio within
  max_image_tokens blocks, scaling up or down; each 14 px patch repeated temporal_patch_size times
  (`patchify`); processing_muse_glimmer.py `MuseGlimmerProcessor.replace_image_token` writes grid_thw.prod() /
  merge² image tokens between <|image_start|> and <|image_end|>.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, ClassVar

from hpcmem.errors import Problems, SpecError
from hpcmem.models.siglip import SIGLIP_ACTIVATIONS
from hpcmem.models.tower_base import (TowerBase, TowerLinear, check_activation, check_counts, check_heads,
                                      encoder_layer_linears, text_width, vision_values)

# configuration_muse_glimmer.py `MuseGlimmerVisionConfig`'s field defaults
MUSE_GLIMMER_VISION_DEFAULTS: dict[str, Any] = {
    "patch_size": 14, "pos_emb_height": 32, "pos_emb_width": 32, "num_attention_heads": 16, "num_hidden_layers": 50,
    "hidden_size": 1536, "intermediate_size": 8960, "hidden_act": "gelu", "patch_temporal": 2, "merge_size": 2}
# `MuseGlimmerConfig`'s projector defaults
MUSE_GLIMMER_OUT_HIDDEN = 6144
MUSE_GLIMMER_PROJECTOR_HIDDEN = 4096
MUSE_GLIMMER_PROJECTOR_ACT = "gelu"
MUSE_GLIMMER_TEXT_HIDDEN = 6656     # `MuseGlimmerTextConfig.hidden_size`: the text width of an omitted text_config
# `MuseGlimmerImageProcessor.max_image_tokens`: merged tokens one image may take
MUSE_GLIMMER_MAX_IMAGE_TOKENS = 4096
# activations.py ACT2FN names whose module keeps its input alone for the backward (GELUActivation, the tanh one)
PROJECTOR_ACTIVATIONS = ("gelu", "gelu_pytorch_tanh")


@dataclass(frozen=True, kw_only=True)
class MuseGlimmerTowerSpec(TowerBase):
    """A windowed NaViT tower run over each image's own patch grid (no class token, no fixed resolution: the
    processor's smart_resize, `grid`), its rows folded 2 × 2 into the adapter and projection. `image_size` is the
    position table's side in pixels (pos_emb_height × patch: also the attention window's side); `out_hidden_size`
    the text width (vision_projection's output), `merged_width` the config's own out_hidden_size."""

    merge_size: int
    patch_temporal: int
    position_side: int          # pos_emb_height = pos_emb_width: the learned table's side
    projector_hidden: int       # projector_hidden_size: vision_adapter's width
    image_size: int
    max_image_tokens: int
    projector_act: str = MUSE_GLIMMER_PROJECTOR_ACT
    norm: str = "layer"         # torch LayerNorms (hpcmem.estimate.vision `block_saved`)
    mlp: str = "fc"             # MuseGlimmerVisionMLP: fc2(act(fc1 x))
    family: str = "muse_glimmer"
    fixed_resolution: bool = False
    hooked_input: bool = False  # MuseGlimmerVisionModel names no input embeddings
    deepstack_visual_indexes: tuple[int, ...] = ()
    activations: ClassVar[tuple[str, ...]] = SIGLIP_ACTIVATIONS
    reads_last_hidden_state: ClassVar[bool] = True

    def __post_init__(self) -> None:
        p = Problems()
        check_counts(p, self, ("depth", "hidden_size", "intermediate_size", "num_heads", "in_channels", "patch_size",
                               "merge_size", "patch_temporal", "position_side", "projector_hidden",
                               "out_hidden_size", "max_image_tokens"))
        check_activation(p, self.hidden_act, self.activations)
        p.raise_if_any()
        check_heads(p, self.hidden_size, self.num_heads, "num_attention_heads")
        p.raise_if_any()

    @property
    def patch_dim(self) -> int:
        """Values per pixel_values row: patch_temporal · 3 · patch² (patch_embedding's input)."""
        return self.patch_temporal * self.in_channels * self.patch_size ** 2

    @property
    def merge_unit(self) -> int:
        return self.merge_size ** 2

    @property
    def merged_width(self) -> int:
        """`pixel_shuffle`'s row: width · merge² (vision_adapter.fc1's input, out_hidden_size)."""
        return self.hidden_size * self.merge_unit

    def linears(self) -> tuple[TowerLinear, ...]:
        """Every nn.Linear (peft's "all-linear" wraps each): the encoder layers' (`vision_tower.layers.N.attn.
        q/k/v_proj`, `attn.proj`, `mlp.fc1`, `mlp.fc2`, all with bias), the patch embedding
        (`vision_tower.patch_embedder.patch_embedding`, part "embed") and the adapter's and projection's
        (`vision_adapter.fc1`, `vision_adapter.fc2`, `vision_projection`, part "merger"), none with a bias."""
        h, i, d, m, p = self.hidden_size, self.intermediate_size, self.depth, self.merged_width, self.projector_hidden
        return (*encoder_layer_linears(h, i, d, out_proj="proj", attention="attn"),
                TowerLinear(name="patch_embedder.patch_embedding", in_features=self.patch_dim, out_features=h,
                            count=1, part="embed", bias=False),
                TowerLinear(name="vision_adapter.fc1", in_features=m, out_features=p, count=1, part="merger",
                            bias=False),
                TowerLinear(name="vision_adapter.fc2", in_features=p, out_features=p, count=1, part="merger",
                            bias=False),
                TowerLinear(name="vision_projection", in_features=p, out_features=self.out_hidden_size, count=1,
                            part="merger", bias=False))

    @property
    def block_params(self) -> int:
        linear = sum(x.params for x in self.linears() if x.part == "tower")
        return linear // self.depth + 4 * self.hidden_size

    @property
    def merger_params(self) -> int:
        """vision_adapter and vision_projection (perception_emb_norm has no weight)."""
        return sum(x.params for x in self.linears() if x.part == "merger")

    @property
    def embed_params(self) -> int:
        """patch_embedding (no bias) and the position table (position_side² rows)."""
        return self.patch_dim * self.hidden_size + self.position_side ** 2 * self.hidden_size

    @property
    def tower_params(self) -> int:
        """MuseGlimmerVisionModel: the patch embedder, ln_pre, the encoder layers, ln_post."""
        return self.embed_params + self.depth * self.block_params + 4 * self.hidden_size

    @property
    def num_params(self) -> int:
        return self.tower_params + self.merger_params

    def grid(self, height: int, width: int) -> tuple[int, int]:
        """(rows, columns) of patches of one image: `smart_resize`'s size over the patch."""
        rows, cols = muse_glimmer_blocks(height, width, self.patch_size * self.merge_size, self.max_image_tokens)
        return rows * self.merge_size, cols * self.merge_size

    def image_patches(self, height: int, width: int) -> int:
        r, c = self.grid(height, width)
        return r * c

    def image_tokens(self, height: int, width: int) -> int:
        """Image tokens of one image: its patches / merge² (`MuseGlimmerProcessor.replace_image_token`)."""
        return self.image_patches(height, width) // self.merge_unit


def muse_glimmer_blocks(height: int, width: int, block: int, max_tokens: int) -> tuple[int, int]:
    """image_processing_muse_glimmer.py `smart_resize` (its size over `block` = patch · merge): the ideal grid of
    blocks, shrunk (aspect kept) into max_tokens blocks; of its floor/ceil neighbours within max_tokens, the one whose
    aspect ratio is nearest the image's (ties to the first in the same set's order); at least 1 × 1."""
    ideal_h, ideal_w = height / block, width / block
    ratio = ideal_w / ideal_h if ideal_h > 0 else 1.0
    if ideal_h * ideal_w > max_tokens:
        ideal_h = (max_tokens / ratio) ** 0.5
        ideal_w = ideal_h * ratio
    candidates = list(set(itertools.product([math.floor(ideal_h), math.ceil(ideal_h)],
                                            [math.floor(ideal_w), math.ceil(ideal_w)])))
    candidates = [(h, w) for h, w in candidates if h >= 1 and w >= 1 and h * w <= max_tokens]
    if not candidates:
        candidates = [(max(1, round(ideal_h)), max(1, round(ideal_w)))]
    return min(candidates, key=lambda grid: abs(grid[0] / grid[1] - height / width))


def muse_glimmer_tower_from_config(cfg: dict[str, Any], name: str) -> MuseGlimmerTowerSpec:
    """The MuseGlimmerTowerSpec of a muse_glimmer config.json dict; keys it omits take the config classes'
    defaults, the processor's max_image_tokens MuseGlimmerImageProcessor's class default."""
    vc = vision_values(cfg, name, MUSE_GLIMMER_VISION_DEFAULTS)
    if vc["pos_emb_height"] != vc["pos_emb_width"]:
        # MuseGlimmerVisionPatchEmbedder: "For now assume pos_emb_height == pos_emb_width always"
        raise SpecError(f"model {name}: vision_config.pos_emb_height {vc['pos_emb_height']!r} is not pos_emb_width "
                        f"{vc['pos_emb_width']!r}: MuseGlimmerVisionPatchEmbedder resamples a square table only")
    out_hidden = cfg.get("out_hidden_size", MUSE_GLIMMER_OUT_HIDDEN)
    if out_hidden != vc["hidden_size"] * vc["merge_size"] ** 2:
        # MuseGlimmerVisionModel.pixel_shuffle hands vision_adapter.fc1 rows of width · merge_size²
        raise SpecError(f"model {name}: out_hidden_size {out_hidden!r} must be vision_config.hidden_size × "
                        f"merge_size² ({vc['hidden_size']} × {vc['merge_size']}²): pixel_shuffle's rows are "
                        "vision_adapter.fc1's input")
    act = cfg.get("projector_hidden_act", MUSE_GLIMMER_PROJECTOR_ACT)
    if act not in PROJECTOR_ACTIVATIONS:
        raise SpecError(f"model {name}: projector_hidden_act {act!r} is not modelled (one of "
                        f"{', '.join(PROJECTOR_ACTIVATIONS)}: an activation that keeps its input alone)")
    return MuseGlimmerTowerSpec(
        model_type="muse_glimmer", depth=vc["num_hidden_layers"], hidden_size=vc["hidden_size"],
        intermediate_size=vc["intermediate_size"], num_heads=vc["num_attention_heads"], in_channels=3,
        patch_size=vc["patch_size"], out_hidden_size=text_width(cfg, MUSE_GLIMMER_TEXT_HIDDEN),
        hidden_act=str(vc["hidden_act"]), merge_size=vc["merge_size"], patch_temporal=vc["patch_temporal"],
        position_side=vc["pos_emb_height"], image_size=vc["pos_emb_height"] * vc["patch_size"],
        projector_hidden=cfg.get("projector_hidden_size", MUSE_GLIMMER_PROJECTOR_HIDDEN), projector_act=str(act),
        max_image_tokens=cfg.get("max_image_tokens", MUSE_GLIMMER_MAX_IMAGE_TOKENS))

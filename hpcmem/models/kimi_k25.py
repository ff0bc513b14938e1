"""KimiK25TowerSpec: Kimi K2.5's (model_type "kimi_k25") MoonViT-style NaViT tower and its multimodal projector
(transformers 5.24 models/kimi_k25/).

- The config (configuration_kimi_k25.py): `Kimi_K25Config.sub_configs_defaults` builds an omitted `vision_config` as
  `Kimi_K25VisionConfig` (width 1152, MLP 4304, 27 layers, 16 heads, 14 px patches, a 64 × 64 (× 4 frames) position
  table, gelu_pytorch_tanh, merge_kernel_size (2, 2), axial 2-D rope) and an omitted `text_config` as a
  `deepseek_v3` (DeepSeek-V3's MLA/MoE decoder, learned: hpcmem.models.vlm_learned); projection_hidden_size 1152,
  tie_word_embeddings True.
- The tower (modeling_kimi_k25.py `Kimi_K25VisionModel`): `Kimi_K25VisionPatchEmbed` (a Conv2d with bias over
  pixel_values [N, 3, 14, 14], one row per patch, then `Kimi_K25VisionPositionEmbeddings`: the 64 × 64 learned table
  resampled bicubically per image by `F.embedding_bag` over 16 taps, plus a sinusoidal time row, a zero row for an
  image), `num_hidden_layers` `Kimi_K25VisionEncoderLayer`s (SigLIP's shape: norm1 → `Kimi_K25VisionAttention`
  q/k/v_proj and proj with biases, axial rope on q and k in fp32, attention per image on the cu_seqlens splits →
  norm2 → fc1 → gelu_pytorch_tanh → fc2; LayerNorms eps 1e-5), `final_layernorm`, then `temporal_merge`: each 2 × 2
  block of rows gathered in fp32 by `index_add_` into [N / 4, 4, width] (no parameters).
- The projector (`Kimi_K25MultimodalProjection`, `Kimi_K25Model.mm_projector`): `pre_norm` LayerNorm over
  projection_hidden_size (the tower width: it runs on each of the four rows) → view [N / 4, 4 · width] → in_proj
  (4 · width → 4 · width) → GELU → out_proj (→ text width): one image token per 4 patches.
- The processor (image_processing_kimi_k25.py `Kimi_K25ImageProcessor`, torchvision-only; size max_height 512,
  max_patches 16384): `navit_resize` scales an image down (never up) into 16,384 patches and 512 patches a side, then
  pads each side up to a multiple of 28 px; its patches are the padded grid's, its image tokens a quarter of them
  (processing_kimi_k25.py `Kimi_K25Processor.replace_image_token`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from hpcmem.errors import SpecError
from hpcmem.models.clip_tower import ClipTowerSpec
from hpcmem.models.siglip import SIGLIP_ACTIVATIONS, SiglipTowerCounts
from hpcmem.models.tower_base import TowerLinear, encoder_layer_linears, text_width, vision_values

# configuration_kimi_k25.py `Kimi_K25VisionConfig`'s field defaults
KIMI_K25_VISION_DEFAULTS: dict[str, Any] = {
    "patch_size": 14, "pos_emb_height": 64, "pos_emb_width": 64, "pos_emb_time": 4, "num_attention_heads": 16,
    "num_hidden_layers": 27, "hidden_size": 1152, "intermediate_size": 4304, "hidden_act": "gelu_pytorch_tanh",
    "merge_kernel_size": (2, 2)}
# `Kimi_K25Config`'s projection_hidden_size default (the projector's pre_norm width)
KIMI_K25_PROJECTION_HIDDEN = 1152
# `Kimi_K25ImageProcessor`'s class defaults: size {"max_height": 512, ...} (patches a side), max_patches
KIMI_K25_PROCESSOR_DEFAULTS: dict[str, Any] = {"max_patches": 16384, "max_size_per_side": 512}
DEEPSEEK_V3_HIDDEN = 7168   # DeepseekV3Config.hidden_size: the text width of an omitted text_config
MERGE = 2                   # merge_kernel_size's side (2 × 2): a quarter of the rows


@dataclass(frozen=True, kw_only=True)
class KimiK25TowerSpec(SiglipTowerCounts, ClipTowerSpec):
    """A SigLIP-shaped tower run over each image's own patch grid (no class token, no fixed resolution), its rows
    merged 2 × 2 into the projector. `image_size` is the position table's side in pixels (pos_emb_height × patch),
    so SiglipTowerCounts' table is pos_emb_height × pos_emb_width rows."""

    max_patches: int
    max_size_per_side: int
    fixed_resolution: bool = False
    family: str = "kimi_k25"
    activations: ClassVar[tuple[str, ...]] = SIGLIP_ACTIVATIONS
    reads_last_hidden_state: ClassVar[bool] = True
    whole_grid: ClassVar[bool] = False

    @property
    def merged_width(self) -> int:
        """A 2 × 2 block's rows flattened: 4 · width (`Kimi_K25MultimodalProjection.hidden_size`)."""
        return self.hidden_size * MERGE ** 2

    @property
    def merge_unit(self) -> int:
        return MERGE ** 2

    def linears(self) -> tuple[TowerLinear, ...]:
        """Every nn.Linear (peft's "all-linear" wraps each): the encoder layers' (`vision_tower.layers.N.attn.q_proj`
        … `attn.proj`, `mlp.fc1`, `mlp.fc2`, all with bias) and the projector's (`mm_projector.in_proj`,
        `mm_projector.out_proj`)."""
        h, i, d, m = self.hidden_size, self.intermediate_size, self.depth, self.merged_width
        return (*encoder_layer_linears(h, i, d, out_proj="proj", attention="attn"),
                TowerLinear(name="in_proj", in_features=m, out_features=m, count=1, part="merger"),
                TowerLinear(name="out_proj", in_features=m, out_features=self.out_hidden_size, count=1,
                            part="merger"))

    @property
    def block_params(self) -> int:
        linear = sum(x.params for x in self.linears() if x.part == "tower")
        return linear // self.depth + 4 * self.hidden_size

    @property
    def merger_params(self) -> int:
        """The projector: `pre_norm` over the tower width and its two linears."""
        return 2 * self.hidden_size + sum(x.params for x in self.linears() if x.part == "merger")

    @property
    def unused_params(self) -> int:
        return 0

    def grid(self, height: int, width: int) -> tuple[int, int]:
        """(rows, columns) of patches of one image: `navit_resize`'s padded size over the patch."""
        return kimi_k25_grid(height, width, self.patch_size, self.max_patches, self.max_size_per_side)

    def image_patches(self, height: int, width: int) -> int:
        r, c = self.grid(height, width)
        return r * c

    def image_tokens(self, height: int, width: int) -> int:
        """Image tokens of one image: its patches / 4 (`Kimi_K25Processor.replace_image_token`)."""
        return self.image_patches(height, width) // MERGE ** 2


def kimi_k25_grid(height: int, width: int, patch: int, max_patches: int, max_side: int) -> tuple[int, int]:
    """image_processing_kimi_k25.py `navit_resize`, then the padded size over the patch (`patchify`): the scale that
    keeps the patches within max_patches and max_side a side, never above 1; each side padded up to a multiple of
    merge · patch."""
    ph, pw = max(1.0, height // patch), max(1.0, width // patch)
    scale = min(1.0, math.sqrt(max_patches / (ph * pw)), max_side * patch / height, max_side * patch / width)
    h = min(max(1, int(height * scale)), max_side * patch)
    w = min(max(1, int(width * scale)), max_side * patch)
    factor = MERGE * patch
    return ((factor - h % factor) % factor + h) // patch, ((factor - w % factor) % factor + w) // patch


def kimi_k25_tower_from_config(cfg: dict[str, Any], name: str) -> KimiK25TowerSpec:
    """The KimiK25TowerSpec of a kimi_k25 config.json dict; keys it omits take the config classes' defaults, the
    processor's settings Kimi_K25ImageProcessor's class defaults."""
    vc = vision_values(cfg, name, KIMI_K25_VISION_DEFAULTS)
    if tuple(vc["merge_kernel_size"]) != (MERGE, MERGE):
        raise SpecError(f"model {name}: hpcmem models kimi_k25 at merge_kernel_size (2, 2) (Kimi_K25VisionConfig's "
                        "default, the processor's merge_size)")
    if isinstance(vc["patch_size"], (list, tuple)) or vc["pos_emb_height"] != vc["pos_emb_width"]:
        raise SpecError(f"model {name}: hpcmem models square patches and a square position table (pos_emb_height = "
                        "pos_emb_width)")
    projection = cfg.get("projection_hidden_size", KIMI_K25_PROJECTION_HIDDEN)
    if projection != vc["hidden_size"]:
        # Kimi_K25MultimodalProjection.pre_norm runs over the merged rows' last dimension, the tower width
        raise SpecError(f"model {name}: projection_hidden_size {projection!r} is not vision_config.hidden_size "
                        f"{vc['hidden_size']!r}: the projector's pre_norm runs over each tower row")
    proc = {**KIMI_K25_PROCESSOR_DEFAULTS, **{k: cfg[k] for k in KIMI_K25_PROCESSOR_DEFAULTS if k in cfg}}
    return KimiK25TowerSpec(
        model_type="kimi_k25", depth=vc["num_hidden_layers"], hidden_size=vc["hidden_size"],
        intermediate_size=vc["intermediate_size"], num_heads=vc["num_attention_heads"], in_channels=3,
        image_size=vc["pos_emb_height"] * vc["patch_size"], patch_size=vc["patch_size"],
        out_hidden_size=text_width(cfg, DEEPSEEK_V3_HIDDEN), hidden_act=str(vc["hidden_act"]), projector_act="gelu",
        projector_bias=True, feature_layer=-1, drop_class_token=False, max_patches=proc["max_patches"],
        max_size_per_side=proc["max_size_per_side"])

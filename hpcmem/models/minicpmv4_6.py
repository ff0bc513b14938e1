"""MiniCpmV46TowerSpec: MiniCPM-V 4.6's (model_type "minicpmv4_6") SigLIP-style tower with its window-attention
merger inside, the MLP merger after it, and its processor's image slices (transformers 5.24 models/minicpmv4_6/).

- The config (configuration_minicpmv4_6.py): `MiniCPMV4_6Config.sub_configs_defaults` builds an omitted
  `vision_config` as `MiniCPMV4_6VisionConfig` (SiglipVisionConfig's fields: width 768, MLP 3072, 12 layers, 12 heads,
  image_size 224, 16 px patches, gelu_pytorch_tanh; window_kernel_size (2, 2)) and an omitted `text_config` as a
  `qwen3_5_text` (Qwen3.5's decoder, learned: hpcmem.models.vlm_learned); insert_layer_id 6 (copied into the vision
  config by `__post_init__`), downsample_mode "16x", merge_kernel_size (2, 2), merger_times 1, tie_word_embeddings
  false.
- The tower (modular_minicpmv4_6.py `MiniCPMV4_6VisionModel`): `MiniCPMV4_6VisionEmbeddings` (Idefics3's: a Conv2d
  patch embedding with bias over the NaViT-packed pixel_values [1, 3, patch, patches · patch], a position table of
  (image_size / patch)² rows read at nearest positions), `num_hidden_layers` SiglipEncoderLayers whose attention
  (`MiniCPMV4_6VisionAttention`) is q/k/v/out_proj with biases run per slice; after layer `insert_layer_id`,
  `MiniCPMV4_6ViTWindowAttentionMerger`: LayerNorm, the same attention over 2 × 2 windows, then each window's four rows
  flattened (4 · width) → `pre_norm` LayerNorm → linear_1 (4 · width → 4 · intermediate) → gelu_pytorch_tanh →
  linear_2 (→ width) plus the window's mean: the later layers run a quarter of the rows; `post_layernorm` last.
- The merger (`MiniCPMV4_6Merger`, merger_times 1: one `MiniCPMV4_6DownsampleMLP`): each 2 × 2 block of the tower's
  rows flattened (4 · width) → `pre_norm` LayerNorm → linear_1 (4 · width → 4 · width) → GELU → linear_2 (→ text
  width): one image token per 16 patches.
- The processor (image_processing_pil_minicpmv4_6.py `MiniCPMV4_6ImageProcessorPil`, class defaults: scale_resolution
  448, max_slice_nums 9, slice_mode true, downsample_mode "16x"): the source image resized to about
  scale_resolution² pixels (`find_best_resize`, sides multiples of 4 · patch), and when the image holds more than one
  scale_resolution² (`get_sliced_grid`) a rows × columns grid of slices of the refined image (`get_refine_size`),
  each a slice of its own; every slice its patches, patches / 16 image tokens (processing_minicpmv4_6.py
  `MiniCPMV4_6Processor.replace_image_token`).
- downsample_mode "4x" (the config's; MiniCPM-OCR's default, hpcmem.models.minicpm_ocr): `get_image_features` runs
  the tower with `use_vit_merger=False`, so every layer runs all the rows and the window merger is loaded and idle
  (its linears part "idle": no gradient, no optimizer state); the processor rounds sides to patch · 2
  (`find_best_resize`'s merge_factor 2) and writes patches / 4 image tokens per slice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, ClassVar

from hpcmem.errors import SpecError
from hpcmem.models.clip_tower import ClipTowerSpec
from hpcmem.models.siglip import SIGLIP_ACTIVATIONS, SiglipTowerCounts
from hpcmem.models.tower_base import TowerLinear, encoder_layer_linears, text_width, vision_values

# configuration_minicpmv4_6.py `MiniCPMV4_6VisionConfig`'s field defaults
MINICPMV4_6_VISION_DEFAULTS: dict[str, Any] = {
    "hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
    "num_channels": 3, "image_size": 224, "patch_size": 16, "hidden_act": "gelu_pytorch_tanh",
    "window_kernel_size": (2, 2)}
# `MiniCPMV4_6Config`'s own defaults
MINICPMV4_6_DEFAULTS: dict[str, Any] = {"insert_layer_id": 6, "downsample_mode": "16x", "merge_kernel_size": (2, 2),
                                        "merger_times": 1}
# `MiniCPMV4_6ImageProcessorPil`'s class defaults (a key of the same name in the model config dict overrides one)
MINICPMV4_6_PROCESSOR_DEFAULTS: dict[str, Any] = {"scale_resolution": 448, "max_slice_nums": 9, "slice_mode": True}
QWEN3_5_HIDDEN = 4096       # Qwen3_5TextConfig.hidden_size: the text width of an omitted text_config
MERGE = 2                   # the window and merge kernels' side (2 × 2), each a quarter of the rows


@dataclass(frozen=True, kw_only=True)
class MiniCpmV46TowerSpec(SiglipTowerCounts, ClipTowerSpec):
    """A SigLIP tower whose window-attention merger after layer `insert_layer_id` quarters the rows, under an MLP
    merger that quarters them again, over the processor's slices."""

    insert_layer_id: int
    downsample_mode: str = "16x"
    scale_resolution: int
    max_slice_nums: int
    slice_mode: bool
    fixed_resolution: bool = False
    family: str = "minicpmv4_6"
    activations: ClassVar[tuple[str, ...]] = SIGLIP_ACTIVATIONS
    reads_last_hidden_state: ClassVar[bool] = True
    whole_grid: ClassVar[bool] = False

    @property
    def window_merger(self) -> bool:
        """The window merger runs: downsample_mode "16x" (`MiniCPMV4_6Model.get_image_features`: `use_vit_merger =
        downsample_mode != "4x"`); at "4x" it is loaded and idle and every layer runs all the rows."""
        return self.downsample_mode == "16x"

    @property
    def token_divisor(self) -> int:
        """Patches per image token: 16 with the window merger, 4 without (processing_minicpmv4_6.py
        `image_token_divisor`)."""
        return MERGE ** 4 if self.window_merger else MERGE ** 2

    @property
    def merged_width(self) -> int:
        """A 2 × 2 window's rows flattened: 4 · width (`window_hidden_size`, the DownsampleMLP's input)."""
        return self.hidden_size * MERGE ** 2

    @property
    def early_layers(self) -> int:
        """Encoder layers over every patch: those up to and including `insert_layer_id`; every layer without the
        window merger (`MiniCPMV4_6VisionModel.forward`'s insert_layer_id -1)."""
        return self.insert_layer_id + 1 if self.window_merger else self.depth

    def linears(self) -> tuple[TowerLinear, ...]:
        """Every nn.Linear (peft's "all-linear" wraps each): the encoder layers', the window merger's (part
        "vit_merger": `vision_tower.vit_merger.`; "idle" at downsample_mode "4x", where it never runs) and the MLP
        merger's (`merger.mlp.0.`)."""
        h, i, d = self.hidden_size, self.intermediate_size, self.depth
        vit = "vit_merger" if self.window_merger else "idle"
        return (*encoder_layer_linears(h, i, d),
                *(TowerLinear(name=f"vit_merger.self_attn.{n}", in_features=h, out_features=h, count=1,
                              part=vit) for n in ("q_proj", "k_proj", "v_proj", "out_proj")),
                TowerLinear(name="vit_merger.linear_1", in_features=self.merged_width,
                            out_features=i * MERGE ** 2, count=1, part=vit),
                TowerLinear(name="vit_merger.linear_2", in_features=i * MERGE ** 2, out_features=h, count=1,
                            part=vit),
                TowerLinear(name="mlp.0.linear_1", in_features=self.merged_width, out_features=self.merged_width,
                            count=1, part="merger"),
                TowerLinear(name="mlp.0.linear_2", in_features=self.merged_width, out_features=self.out_hidden_size,
                            count=1, part="merger"))

    @property
    def vit_merger_params(self) -> int:
        """The window merger: its two LayerNorms (width, 4 · width) and its linears."""
        return 2 * self.hidden_size + 2 * self.merged_width + sum(
            x.params for x in self.linears() if x.name.startswith("vit_merger."))

    @property
    def tower_params(self) -> int:
        """`MiniCPMV4_6VisionModel`: SigLIP's embeddings, layers and post_layernorm, and the window merger."""
        return super().tower_params + self.vit_merger_params

    @property
    def block_params(self) -> int:
        linear = sum(x.params for x in self.linears() if x.part == "tower")
        return linear // self.depth + 4 * self.hidden_size

    @property
    def merger_params(self) -> int:
        """The MLP merger: `pre_norm` over 4 · width and its two linears."""
        return 2 * self.merged_width + sum(x.params for x in self.linears() if x.part == "merger")

    @property
    def idle_params(self) -> int:
        """The window merger at downsample_mode "4x": loaded, never run, so no gradient and no optimizer state."""
        return 0 if self.window_merger else self.vit_merger_params

    @property
    def unused_params(self) -> int:
        return self.idle_params

    def slices(self, height: int, width: int) -> tuple[tuple[int, int], ...]:
        """(rows, columns) of patches of each slice the tower runs for one image: the source, then the grid's."""
        return minicpmv4_6_slices(height, width, self.patch_size, self.scale_resolution, self.max_slice_nums,
                                  self.slice_mode, MERGE ** 2 if self.window_merger else MERGE)

    def image_patches(self, height: int, width: int) -> int:
        return sum(r * c for r, c in self.slices(height, width))

    def image_tokens(self, height: int, width: int) -> int:
        """Image tokens of one image: each slice's patches / 16 at downsample_mode "16x", / 4 at "4x"
        (`replace_image_token` over `image_token_divisor`)."""
        return sum(r * c // self.token_divisor for r, c in self.slices(height, width))


def _ensure_divide(length: float, divisor: int) -> int:
    """image_processing_pil_minicpmv4_6.py `ensure_divide`: round to a multiple of divisor, at least divisor."""
    return max(round(length / divisor) * divisor, divisor)


def _best_resize(height: float, width: float, scale: int, patch: int, upscale: bool,
                 merge: int) -> tuple[int, int]:
    """`find_best_resize`: sides multiples of patch · merge (merge_factor 4 at downsample_mode "16x", 2 at "4x")."""
    if height * width > scale * scale or upscale:
        aspect = width / height
        height = int(scale / math.sqrt(aspect))
        width = int(height * aspect)
    return _ensure_divide(height, patch * merge), _ensure_divide(width, patch * merge)


def _sliced_grid(height: int, width: int, max_slices: int, scale: int) -> tuple[int, int] | None:
    """`get_sliced_grid`: (rows, columns) of slices, or None for an image of at most one scale² (ratio ≤ 1)."""
    log_ratio = math.log(width / height)
    multiple = min(math.ceil(width * height / (scale * scale)), max_slices)
    if multiple <= 1:
        return None
    best, least = (1, 1), float("inf")
    for n in (multiple - 1, multiple, multiple + 1):
        if n == 1 or n > max_slices:
            continue
        for rows in range(1, n + 1):
            if n % rows == 0:
                error = abs(log_ratio - math.log((n // rows) / rows))
                if error < least or (error == least and rows > best[0]):
                    best, least = (rows, n // rows), min(error, least)
    return best


@lru_cache(maxsize=256)
def minicpmv4_6_slices(height: int, width: int, patch: int, scale: int, max_slices: int,
                       slice_mode: bool, merge: int = MERGE ** 2) -> tuple[tuple[int, int], ...]:
    """(rows, columns) of patches per slice of one image (`MiniCPMV4_6ImageProcessorPil._preprocess`): the source
    resized by `find_best_resize` (upscaled when it is not sliced), then the grid's slices of the image resized by
    `get_refine_size`, each the refined size over the grid."""
    grid = _sliced_grid(height, width, max_slices, scale) if slice_mode else None
    h, w = _best_resize(height, width, scale, patch, upscale=grid is None, merge=merge)
    out = [(h // patch, w // patch)]
    if grid is not None:
        rows, cols = grid
        rh, rw = _best_resize(_ensure_divide(height, rows) / rows, _ensure_divide(width, cols) / cols, scale, patch,
                              upscale=True, merge=merge)
        out += [(rh // patch, rw // patch)] * (rows * cols)
    return tuple(out)


def minicpmv4_6_tower_from_config(cfg: dict[str, Any], name: str, model_type: str = "minicpmv4_6",
                                  downsample_default: str = "16x") -> MiniCpmV46TowerSpec:
    """The MiniCpmV46TowerSpec of a minicpmv4_6 config.json dict; keys it omits take the config classes' defaults,
    the processor's settings MiniCPMV4_6ImageProcessorPil's class defaults. model_type names a subclass that keeps
    these classes' fields (minicpmv4_7: hpcmem.models.minicpmv4_7; minicpm_ocr: hpcmem.models.minicpm_ocr, whose
    config class defaults downsample_mode to downsample_default "4x")."""
    vc = vision_values(cfg, name, MINICPMV4_6_VISION_DEFAULTS)
    defaults = {**MINICPMV4_6_DEFAULTS, "downsample_mode": downsample_default}
    outer = {**defaults, **{k: cfg[k] for k in defaults if k in cfg}}
    proc = {**MINICPMV4_6_PROCESSOR_DEFAULTS, **{k: cfg[k] for k in MINICPMV4_6_PROCESSOR_DEFAULTS if k in cfg}}
    if outer["downsample_mode"] not in ("16x", "4x") or outer["merger_times"] != 1 \
            or tuple(outer["merge_kernel_size"]) != (MERGE, MERGE) \
            or tuple(vc["window_kernel_size"]) != (MERGE, MERGE):
        raise SpecError(f"model {name}: hpcmem models {model_type} at downsample_mode 16x or 4x, merger_times 1 and "
                        f"2 × 2 window and merge kernels (MiniCPMV4_6Config's defaults); got downsample_mode "
                        f"{outer['downsample_mode']!r}, merger_times {outer['merger_times']!r}")
    depth, insert = vc["num_hidden_layers"], outer["insert_layer_id"]
    if outer["downsample_mode"] == "16x" and (not isinstance(insert, int) or not 0 <= insert < depth):
        # MiniCPMV4_6VisionModel.forward runs the window merger only after layer insert_layer_id; without it the
        # merger's `target_sizes // 2` no longer matches the rows ("4x" skips the window merger and ignores it)
        raise SpecError(f"model {name}: insert_layer_id {insert!r} must name one of the tower's {depth} layers "
                        "(MiniCPMV4_6VisionModel runs its window merger after that layer)")
    if isinstance(vc["patch_size"], (list, tuple)) or isinstance(vc["image_size"], (list, tuple)):
        raise SpecError(f"model {name}: hpcmem models square patches and position tables (integers)")
    return MiniCpmV46TowerSpec(
        model_type=model_type, depth=depth, hidden_size=vc["hidden_size"],
        intermediate_size=vc["intermediate_size"], num_heads=vc["num_attention_heads"], in_channels=vc["num_channels"],
        image_size=vc["image_size"], patch_size=vc["patch_size"], out_hidden_size=text_width(cfg, QWEN3_5_HIDDEN),
        hidden_act=str(vc["hidden_act"]), projector_act="gelu", projector_bias=True, feature_layer=-1,
        drop_class_token=False, insert_layer_id=insert, downsample_mode=outer["downsample_mode"],
        scale_resolution=proc["scale_resolution"], max_slice_nums=proc["max_slice_nums"],
        slice_mode=bool(proc["slice_mode"]))

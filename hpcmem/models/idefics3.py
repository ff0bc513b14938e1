"""Idefics3TowerSpec: the vision tower and connector of SmolVLM / SmolVLM2 (model_type "smolvlm") and Idefics3
("idefics3"), as their config.json's `vision_config` and outer keys describe them, their linear layers, parameter
count and the image processor's tiling (transformers 5.24).

- The tower (models/smolvlm/modeling_smolvlm.py `SmolVLMVisionTransformer`, models/idefics3/modeling_idefics3.py
  `Idefics3VisionTransformer`, the same code): a Conv2d patch embedding with bias (`patch_embedding`, kernel = stride
  = patch_size), a learned position table of (image_size / patch_size)² rows (`position_embedding`, bucketed onto each
  tile's patch grid), `num_hidden_layers` encoder layers (LayerNorm → q/k/v/out_proj with biases, full bidirectional
  attention over one tile's patches → LayerNorm → fc1 → gelu_pytorch_tanh → fc2 with biases) and `post_layernorm`: a
  SigLIP tower without a pooling head. Its `get_input_embeddings` is its `embeddings` module.
- The connector (`SmolVLMConnector` / `Idefics3Connector`): `pixel_shuffle` folds scale_factor × scale_factor
  neighbouring patches into one row of width hidden_size · scale_factor² (views, permutes and a reshape copy), then
  `modality_projection.proj`, one nn.Linear(hidden_size · scale_factor² → text hidden_size) without bias
  (`SmolVLMSimpleMLP` / `Idefics3SimpleMLP`).
- The model (`SmolVLMModel.get_image_features`): pixel_values [batch, tiles, 3, tile, tile] in the weight dtype,
  all-zero (padding) tiles dropped, the tower over every tile, the connector; (tile / patch_size)² / scale_factor² image
  tokens per tile (`SmolVLMModel.image_seq_len`) replace the image tokens' embeddings. The text model is a Llama
  (`sub_configs_defaults` text_config: llama).
- The image processor (models/smolvlm/image_processing_pil_smolvlm.py `SmolVLMImageProcessorPil._preprocess`,
  Idefics3's the same): resize so the longest edge is `size.longest_edge` (`get_resize_output_image_size`), then with
  `do_image_splitting` round both sides up to multiples of `max_image_size.longest_edge` (`resize_for_vision_encoder`)
  and cut that into rows × cols tiles plus one global tile (the image resized to one tile) when it exceeds one tile
  (`split_images`): `idefics3_tiles`.

Where the processor's settings come from: SmolVLM2's published config.json names them in its vision_config (`size`
{"longest_edge": 2048}, `max_image_size` {"longest_edge": 512} for SmolVLM2-500M-Video-Instruct, as its
preprocessor_config.json does); a config that omits them takes max_image_size = the vision config's image_size and
size = 4 × that, the ratio of the image processor class's defaults (4 · 364 over 364). Splitting is on
(`do_image_splitting` True, the class default and the published checkpoints').
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from hpcmem.errors import Problems, SpecError
from hpcmem.models.siglip import SiglipTowerCounts
from hpcmem.models.tower_base import (LinearTower, TowerLinear, check_activation, check_counts, check_heads,
                                      encoder_layer_linears, grid_patches, text_width)

# SmolVLMVisionConfig / Idefics3VisionConfig class defaults (configuration_smolvlm.py, configuration_idefics3.py),
# which a published vision_config may omit (SmolVLM2-500M-Video-Instruct's names neither num_hidden_layers nor
# intermediate_size)
IDEFICS3_VISION_DEFAULTS: dict[str, Any] = {
    "hidden_size": 1152, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 16,
    "num_channels": 3, "image_size": 224, "patch_size": 32, "hidden_act": "gelu_pytorch_tanh"}
SCALE_FACTOR = 2            # SmolVLMConfig.scale_factor / Idefics3Config.scale_factor
TEXT_HIDDEN = 4096          # LlamaConfig.hidden_size, the text_config default
SIZE_OVER_TILE = 4          # SmolVLMImageProcessor.size {"longest_edge": 4 * 364} over max_image_size 364
MAX_IMAGE_SIZE = 4096       # image_processing_pil_smolvlm.py MAX_IMAGE_SIZE: no side above it after the first resize
# the activations whose saved tensors hpcmem.estimate.vision derives for a two-linear MLP
ACTIVATIONS = ("gelu_pytorch_tanh", "gelu")


@dataclass(frozen=True, kw_only=True)
class Idefics3TowerSpec(SiglipTowerCounts, LinearTower):
    """A SmolVLM / Idefics3 tower and connector; `out_hidden_size` is the text model's width (the connector's
    output), `tile` the processor's max_image_size.longest_edge, `longest_edge` its size.longest_edge."""

    image_size: int
    scale_factor: int
    tile: int
    longest_edge: int
    # what the shared vision code reads of a tower (hpcmem.models.vision_spec.VisionSpec's names)
    norm: str = "layer"
    mlp: str = "fc"
    deepstack_visual_indexes: tuple[int, ...] = ()
    deepstack_params: int = 0
    hooked_input: bool = True
    family: str = "idefics3"

    def __post_init__(self) -> None:
        p = Problems()
        check_counts(p, self, ("depth", "hidden_size", "intermediate_size", "num_heads", "in_channels", "image_size",
                               "patch_size", "out_hidden_size", "scale_factor", "tile", "longest_edge"), prefix="")
        check_activation(p, self.hidden_act, ACTIVATIONS)
        p.raise_if_any()
        check_heads(p, self.hidden_size, self.num_heads, "num_attention_heads")
        p.raise_if_any()

    @property
    def fold_problem(self) -> str | None:
        """Why images fail on this model, or None: SmolVLMConnector.pixel_shuffle folds each tile's square patch grid
        of side tile / patch_size by scale_factor (a text-only job never runs it; hpcmem.job.image_rules refuses
        images)."""
        side = self.tile // self.patch_size
        if self.tile % self.patch_size == 0 and side % self.scale_factor == 0:
            return None
        return (f"{self.model_type}: max_image_size.longest_edge {self.tile} / patch_size {self.patch_size} does not "
                f"give a whole patch grid whose side is a multiple of scale_factor {self.scale_factor}; "
                "SmolVLMConnector.pixel_shuffle fails on images")

    @property
    def patches(self) -> int:
        """Patches per tile, the tower's rows per tile: (tile / patch_size)²."""
        return grid_patches(self.tile, self.patch_size)

    @property
    def tokens_per_tile(self) -> int:
        """Image tokens per tile: patches / scale_factor² (SmolVLMModel.image_seq_len at the processor's tile)."""
        return self.patches // self.scale_factor ** 2

    @property
    def merged_width(self) -> int:
        """The connector's input width: hidden_size · scale_factor²."""
        return self.hidden_size * self.scale_factor ** 2

    @property
    def merge_unit(self) -> int:
        return self.scale_factor ** 2

    def linears(self) -> tuple[TowerLinear, ...]:
        h, i, d = self.hidden_size, self.intermediate_size, self.depth
        return (*encoder_layer_linears(h, i, d),
                TowerLinear(name="modality_projection.proj", in_features=self.merged_width,
                               out_features=self.out_hidden_size, count=1, part="merger", bias=False))

    @property
    def table_positions(self) -> int:
        """The position table's rows: (image_size / patch_size)², not a tile's patches."""
        return grid_patches(self.image_size, self.patch_size)


def _resize_longest(height: int, width: int, longest: int) -> tuple[int, int]:
    """image_processing_pil_smolvlm.py `get_resize_output_image_size`: `_resize_output_size_rescale_to_max_len` (the
    longest side to `longest`, the other by the aspect ratio, int() then rounded up to even, at least 1), then
    `_resize_output_size_scale_below_upper_bound` (no side above MAX_IMAGE_SIZE)."""
    aspect = width / height
    if width >= height:
        width = longest
        height = int(width / aspect)
        height += height % 2
    else:
        height = longest
        width = int(height * aspect)
        width += width % 2
    height, width = max(height, 1), max(width, 1)
    aspect = width / height
    if width >= height and width > MAX_IMAGE_SIZE:
        width, height = MAX_IMAGE_SIZE, int(MAX_IMAGE_SIZE / aspect)
    elif height > width and height > MAX_IMAGE_SIZE:
        height, width = MAX_IMAGE_SIZE, int(MAX_IMAGE_SIZE * aspect)
    return max(height, 1), max(width, 1)


def idefics3_tiles(height: int, width: int, longest_edge: int, tile: int) -> tuple[tuple[int, int], int, int]:
    """((height, width) the image is cut from, rows, cols) for one image of height × width pixels
    (SmolVLMImageProcessorPil._preprocess with do_resize and do_image_splitting): the longest edge to
    `longest_edge` (`_resize_longest`), both sides rounded up to multiples of `tile` (`resize_for_vision_encoder`:
    the longest side by ceil, the other from the aspect ratio by int() then ceil), then `split_images`: rows × cols
    tiles when a side exceeds one tile (plus the global tile), else (0, 0): the image is one tile. Tiles per image:
    rows · cols + 1, or 1."""
    h, w = _resize_longest(height, width, longest_edge)
    aspect = w / h
    if w >= h:
        w = math.ceil(w / tile) * tile
        h = math.ceil(int(w / aspect) / tile) * tile
    else:
        h = math.ceil(h / tile) * tile
        w = math.ceil(int(h * aspect) / tile) * tile
    if h > tile or w > tile:
        return (h, w), (h - tile) // tile + 1, (w - tile) // tile + 1
    return (h, w), 0, 0


def idefics3_tower_from_config(cfg: dict[str, Any], name: str) -> Idefics3TowerSpec:
    """The Idefics3TowerSpec of a smolvlm / idefics3 config.json dict; keys it omits take the config classes'
    defaults, and the processor's settings those the module docstring names."""
    raw = cfg.get("vision_config") or {}
    if not isinstance(raw, dict):
        raise SpecError(f"model {name}: vision_config must be an object, got {type(raw).__name__}")
    vc = {**IDEFICS3_VISION_DEFAULTS, **raw}
    for key in ("image_size", "patch_size"):
        if isinstance(vc[key], (list, tuple)):
            raise SpecError(f"model {name}: vision_config.{key} {vc[key]!r}: hpcmem models square tiles (an integer)")
    tile = (vc.get("max_image_size") or {}).get("longest_edge", vc["image_size"])
    longest = (vc.get("size") or {}).get("longest_edge", SIZE_OVER_TILE * tile if isinstance(tile, int) else tile)
    width = text_width(cfg, TEXT_HIDDEN)
    return Idefics3TowerSpec(model_type=str(cfg["model_type"]), depth=vc["num_hidden_layers"],
                             hidden_size=vc["hidden_size"], intermediate_size=vc["intermediate_size"],
                             num_heads=vc["num_attention_heads"], in_channels=vc["num_channels"],
                             image_size=vc["image_size"], patch_size=vc["patch_size"], out_hidden_size=width,
                             hidden_act=str(vc["hidden_act"]), scale_factor=cfg.get("scale_factor", SCALE_FACTOR),
                             tile=tile, longest_edge=longest)

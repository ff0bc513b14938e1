"""Molmo2TowerSpec: Molmo2's (model_type "molmo2") ViT over fixed-size overlapping crops and its pooling adapter
(transformers 5.24 models/molmo2/modular_molmo2.py, generated into configuration_molmo2.py, modeling_molmo2.py,
image_processing_molmo2.py and processing_molmo2.py).

- The config: `Molmo2Config.sub_configs_defaults` builds an omitted `vision_config` as `Molmo2VisionConfig` (width
  1152, MLP 4304, 25 layers, 16 heads of head_dim 72, 14 px patches, gelu_pytorch_tanh, image_size 378 × 378, a
  learned position table of (378 / 14)² = 729 rows), `adapter_config` as `Molmo2AdapterConfig` (vision_feature_layer
  [24, 18]; the pooling attention 16 heads of 72 over width 1152, attention_bias True; a SiLU-gated MLP of
  intermediate_size 18944 without biases to text_hidden_size 3584) and `text_config` as `Molmo2TextConfig` (4096
  wide: learned, hpcmem.models.vlm_learned); tie_word_embeddings False, and the class declares no tied weights.
- The tower (`Molmo2VisionModel`): `patch_embedding` an nn.Linear(3 · 14² → width, with bias) over the processor's
  flattened patches, plus the whole position table (no resize: every crop has exactly its 729 patches), then
  `num_hidden_layers` `Molmo2VisionEncoderLayer`s (layer_norm1 → q/k/v_proj → SDPA over the crop's patches, no mask
  → o_proj → residual, layer_norm2 → fc1 → gelu_pytorch_tanh → fc2 → residual; every linear with a bias). No final
  norm: `Molmo2Model.get_image_features` concatenates the outputs of the layers `vision_feature_layer` names
  (`hidden_states[layer + 1]`) along the width.
- The adapter (`Molmo2Adapter`): each image token pools a pooling_size window (2 × 2) of those concatenated patch
  features — `image_pooling_2d`, a `Molmo2VisionAttention` whose query is the window's mean and whose keys and values
  are the window's patches (q/k/v_proj from len(vision_feature_layer) · width, o_proj to the adapter width), then
  `image_projector` (gate_proj and up_proj → intermediate_size, SiLU, down_proj → text_hidden_size).
- The image processor (`Molmo2ImageProcessor`, torchvision's only): a global crop (the image resized to 378²) and
  tiling_h × tiling_w overlapping 378² crops of a canvas the image is resized to (`select_tiling` over at most
  max_crops 8 crops, overlap_margins [4, 4] patches), each crop 729 patch rows; the image's tokens one per pooling
  window: ⌈27 / 2⌉² for the global crop and ⌈canvas rows / 2⌉ · ⌈canvas columns / 2⌉ for the canvas without the
  overlaps. `Molmo2Processor.replace_image_token` writes each view as a start token, its <im_patch> tokens with an
  <im_col> after each row, and <im_end> (`text_tokens`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from hpcmem.errors import Problems, SpecError
from hpcmem.models.siglip import SIGLIP_ACTIVATIONS
from hpcmem.models.tower_base import (TowerBase, TowerLinear, check_activation, check_counts, check_heads,
                                      encoder_layer_linears)

# configuration_molmo2.py `Molmo2VisionConfig`'s field defaults
MOLMO2_VISION_DEFAULTS: dict[str, Any] = {
    "hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 25, "num_attention_heads": 16,
    "num_key_value_heads": 16, "head_dim": 72, "hidden_act": "gelu_pytorch_tanh", "image_size": None,
    "patch_size": 14, "num_position_embeddings": None, "num_channels": 3, "attention_bias": True}
# configuration_molmo2.py `Molmo2AdapterConfig`'s field defaults
MOLMO2_ADAPTER_DEFAULTS: dict[str, Any] = {
    "vision_feature_layer": None, "hidden_size": 1152, "num_attention_heads": 16, "num_key_value_heads": 16,
    "head_dim": 72, "attention_bias": True, "hidden_act": "silu", "intermediate_size": 18944,
    "text_hidden_size": 3584, "mlp_bias": False}
DEFAULT_FEATURE_LAYERS = (24, 18)       # `Molmo2AdapterConfig.__post_init__`
DEFAULT_IMAGE_SIZE = 378                # `Molmo2VisionConfig.__post_init__`: [378, 378]
MOLMO2_TEXT_HIDDEN = 4096               # `Molmo2TextConfig.hidden_size`: the text width of an omitted text_config
# image_processing_molmo2.py `Molmo2ImageProcessor`'s class defaults
MAX_CROPS, OVERLAP_MARGINS, POOLING = 8, (4, 4), (2, 2)


def select_tiling(height: int, width: int, window: int, max_crops: int) -> tuple[int, int]:
    """image_processing_molmo2.py `select_tiling`: the (rows, columns) of crop windows, at most max_crops of them,
    sorted by count then rows; the one needing the least upscaling that covers the image, or, when every one would
    downscale it, the one downscaling it least (the first such in that order)."""
    tilings = sorted(((th, tw) for th in range(1, max_crops + 1) for tw in range(1, max_crops + 1)
                      if th * tw <= max_crops), key=lambda x: (x[0] * x[1], x[0]))
    scales = [min(th * window / height, tw * window / width) for th, tw in tilings]
    if all(s < 1 for s in scales):
        return tilings[scales.index(max(scales))]
    up = [s if s >= 1 else math.inf for s in scales]
    return tilings[up.index(min(up))]


@dataclass(frozen=True, kw_only=True)
class Molmo2TowerSpec(TowerBase):
    """The ViT run over every crop's patches and the pooling adapter (the module docstring)."""

    image_size: int             # the crop side (the vision config's image_size; the processor's `size`)
    feature_layers: tuple[int, ...]     # adapter_config.vision_feature_layer, as given
    adapter_hidden: int         # adapter_config.hidden_size: image_pooling_2d's output
    adapter_heads: int
    adapter_intermediate: int
    attention_bias: bool = True     # vision_config's: the layers' q/k/v/o_proj
    adapter_bias: bool = True       # adapter_config's: image_pooling_2d's q/k/v/o_proj
    max_crops: int = MAX_CROPS
    overlap_margins: tuple[int, int] = OVERLAP_MARGINS
    pooling: tuple[int, int] = POOLING
    norm: str = "layer"         # torch LayerNorms (hpcmem.estimate.vision `block_saved`)
    mlp: str = "fc"             # Molmo2VisionMLP: fc2(act(fc1 x))
    family: str = "molmo2"
    hooked_input: bool = False  # Molmo2VisionModel's get_input_embeddings raises NotImplementedError: no hook
    deepstack_visual_indexes: tuple[int, ...] = ()
    activations: ClassVar[tuple[str, ...]] = SIGLIP_ACTIVATIONS

    def __post_init__(self) -> None:
        p = Problems()
        check_counts(p, self, ("depth", "hidden_size", "intermediate_size", "num_heads", "in_channels", "patch_size",
                               "out_hidden_size", "image_size", "adapter_hidden", "adapter_heads",
                               "adapter_intermediate"))
        check_activation(p, self.hidden_act, self.activations)
        p.raise_if_any()
        check_heads(p, self.hidden_size, self.num_heads, "num_attention_heads")
        p.check(self.image_size % self.patch_size == 0,
                f"vision_config.image_size {self.image_size} is not a multiple of patch_size {self.patch_size}")
        p.check(all(-self.depth <= x < self.depth for x in self.feature_layers),
                f"adapter_config.vision_feature_layer {list(self.feature_layers)} must index the {self.depth} layers "
                "of vision_config (Molmo2Config.validate_architecture)")
        p.raise_if_any()
        p.check(self.feature_span[1] == self.depth - 1,
                f"adapter_config.vision_feature_layer {list(self.feature_layers)} does not read the last of the "
                f"{self.depth} vision layers: hpcmem models a tower whose every layer is on the loss's path (the "
                "released configs' trim, Molmo2Config.__post_init__)")
        p.raise_if_any()

    @property
    def feature_span(self) -> tuple[int, int]:
        """The lowest and the highest layer vision_feature_layer reads (negative indices counted from the last)."""
        layers = [x % self.depth for x in self.feature_layers]
        return min(layers), max(layers)

    @property
    def side(self) -> int:
        """Patches a crop side: image_size / patch_size."""
        return self.image_size // self.patch_size

    @property
    def patches(self) -> int:
        """Patch rows per crop: side², the position table's rows."""
        return self.side ** 2

    @property
    def feature_width(self) -> int:
        """The image tokens' width: down_proj's output, text_hidden_size."""
        return self.out_hidden_size

    @property
    def pooled_width(self) -> int:
        """The concatenated features' width, image_pooling_2d's q/k/v input: len(vision_feature_layer) · width."""
        return len(self.feature_layers) * self.hidden_size

    @property
    def pool_unit(self) -> int:
        """Patches a pooling window: pool_h · pool_w."""
        return self.pooling[0] * self.pooling[1]

    def linears(self) -> tuple[TowerLinear, ...]:
        """Every nn.Linear (peft's "all-linear" wraps each): the encoder layers' (`vision_tower.layers.N.self_attn.
        q/k/v/o_proj`, `mlp.fc1`, `mlp.fc2`, all with bias), the patch embedding (part "embed") and the adapter's
        (`multi_modal_projector.image_pooling_2d.q/k/v/o_proj` with attention_bias, `image_projector.gate/up/
        down_proj` without bias: mlp_bias False, down_proj never)."""
        h, i, d, a, f = self.hidden_size, self.intermediate_size, self.depth, self.adapter_hidden, self.pooled_width
        b = self.adapter_bias
        return (*encoder_layer_linears(h, i, d, out_proj="o_proj", attention_bias=self.attention_bias),
                TowerLinear(name="patch_embedding", in_features=self.patch_dim, out_features=h, count=1, part="embed"),
                *(TowerLinear(name=f"image_pooling_2d.{n}", in_features=f, out_features=a, count=1, part="merger",
                              bias=b) for n in ("q_proj", "k_proj", "v_proj")),
                TowerLinear(name="image_pooling_2d.o_proj", in_features=a, out_features=a, count=1, part="merger",
                            bias=b),
                *(TowerLinear(name=f"image_projector.{n}", in_features=a, out_features=self.adapter_intermediate,
                              count=1, part="merger", bias=False) for n in ("gate_proj", "up_proj")),
                TowerLinear(name="image_projector.down_proj", in_features=self.adapter_intermediate,
                            out_features=self.out_hidden_size, count=1, part="merger", bias=False))

    @property
    def block_params(self) -> int:
        """One encoder layer: its six linears and two LayerNorms (weight and bias)."""
        return sum(x.params for x in self.linears() if x.part == "tower") // self.depth + 4 * self.hidden_size

    @property
    def embed_params(self) -> int:
        """patch_embedding (weight and bias) and the position table (side² rows)."""
        h = self.hidden_size
        return self.patch_dim * h + h + self.patches * h

    @property
    def merger_params(self) -> int:
        """The adapter: its linears (it has no norm)."""
        return sum(x.params for x in self.linears() if x.part == "merger")

    @property
    def tower_params(self) -> int:
        """Molmo2VisionModel: the embedding and the encoder layers (no final norm)."""
        return self.embed_params + self.depth * self.block_params

    @property
    def num_params(self) -> int:
        return self.tower_params + self.merger_params

    def layout(self, height: int, width: int) -> tuple[int, int, int, int]:
        """image_processing_molmo2.py `compute_crop_geometry`: (tiling rows, tiling columns, canvas height, canvas
        width) of one image."""
        left, right = self.overlap_margins
        window = (self.side - left - right) * self.patch_size
        margin = (left + right) * self.patch_size
        if min(height, width) <= margin:
            raise SpecError(f"image_height × image_width {height}×{width}: Molmo2ImageProcessor tiles an image less "
                            f"its {margin}-px overlap margins (`select_tiling` then scales by a size ≤ 0), which "
                            f"hpcmem does not model; give sides above {margin} px")
        th, tw = select_tiling(height - margin, width - margin, window, self.max_crops)
        return th, tw, th * window + margin, tw * window + margin

    def crops(self, height: int, width: int) -> int:
        """Crops of one image: the tiling's and the global one (`get_image_grid_and_crops`)."""
        th, tw, _, _ = self.layout(height, width)
        return th * tw + 1

    def grid(self, height: int, width: int) -> tuple[int, int, int, int]:
        """image_grids' row: the pooled (rows, columns) of the global crop and of the canvas
        (`get_image_grid_and_crops`: ⌈patches / pooling⌉ each way)."""
        _, _, ch, cw = self.layout(height, width)
        ph, pw = self.pooling
        p = self.patch_size
        return (math.ceil(self.side / ph), math.ceil(self.side / pw), math.ceil(ch // p / ph),
                math.ceil(cw // p / pw))

    def image_tokens(self, height: int, width: int) -> int:
        """<im_patch> tokens of one image, the adapter's output rows for it (`get_number_of_image_patches`)."""
        rh, rw, hh, hw = self.grid(height, width)
        return rh * rw + hh * hw

    def text_tokens(self, height: int, width: int) -> int:
        """Tokens `Molmo2Processor.replace_image_token` writes for one image at the class defaults
        (image_use_col_tokens True, use_single_crop_col_tokens None: the same): per view a start token, each pooled
        row's <im_patch> tokens and one <im_col>, <im_end>."""
        rh, rw, hh, hw = self.grid(height, width)
        return (2 + rh * (rw + 1)) + (2 + hh * (hw + 1))


def molmo2_tower_from_config(cfg: dict[str, Any], name: str) -> Molmo2TowerSpec:
    """The Molmo2TowerSpec of a molmo2 config.json dict; keys it omits take the config classes' defaults. The
    released checkpoints' spellings (`vit_config`, `image_default_input_size`, `image_patch_size`, `image_num_pos`,
    `vit_layers`) and their layer trim are not read: such a config is refused."""
    for key in ("vision_config", "adapter_config", "text_config"):
        if cfg.get(key) is not None and not isinstance(cfg[key], dict):
            raise SpecError(f"model {name}: {key} must be an object, got {type(cfg[key]).__name__}")
    if "vit_config" in cfg:
        raise SpecError(f"model {name}: vit_config (a released checkpoint's spelling, which Molmo2Config renames and "
                        "trims to the layers vit_layers reads) is not read by hpcmem; give vision_config and "
                        "adapter_config as Molmo2Config saves them")
    vc = {**MOLMO2_VISION_DEFAULTS, **(cfg.get("vision_config") or {})}
    ac = {**MOLMO2_ADAPTER_DEFAULTS, **(cfg.get("adapter_config") or {})}
    text = cfg.get("text_config") or {}
    size = vc["image_size"] or [DEFAULT_IMAGE_SIZE, DEFAULT_IMAGE_SIZE]
    if not isinstance(size, (list, tuple)) or len(size) != 2 or size[0] != size[1]:
        raise SpecError(f"model {name}: vision_config.image_size {size!r} must be a square [side, side] "
                        "(Molmo2ImageProcessor refuses a non-square `size`)")
    side = size[0] // vc["patch_size"] if isinstance(size[0], int) and vc["patch_size"] else 0
    if vc["num_position_embeddings"] not in (None, side * side):
        raise SpecError(f"model {name}: vision_config.num_position_embeddings {vc['num_position_embeddings']!r} is "
                        f"not the crop's {side * side} patches; Molmo2VisionModel adds the whole table to every crop")
    for key, rule in (("head_dim", vc["hidden_size"] // max(1, vc["num_attention_heads"])),
                      ("num_key_value_heads", vc["num_attention_heads"])):
        if vc[key] != rule:
            raise SpecError(f"model {name}: vision_config.{key} {vc[key]!r}: hpcmem models the tower at "
                            f"hidden_size / num_attention_heads head_dim and no grouped heads ({key} {rule})")
    for key, rule in (("head_dim", ac["hidden_size"] // max(1, ac["num_attention_heads"])),
                      ("num_key_value_heads", ac["num_attention_heads"])):
        if ac[key] != rule:
            raise SpecError(f"model {name}: adapter_config.{key} {ac[key]!r}: hpcmem models the pooling attention at "
                            f"hidden_size / num_attention_heads head_dim and no grouped heads ({key} {rule})")
    if ac["hidden_act"] != "silu" or ac["mlp_bias"]:
        raise SpecError(f"model {name}: adapter_config hidden_act {ac['hidden_act']!r}, mlp_bias {ac['mlp_bias']!r}: "
                        "hpcmem models Molmo2AdapterConfig's SiLU-gated projector without biases")
    width = text.get("hidden_size", MOLMO2_TEXT_HIDDEN)
    if ac["text_hidden_size"] != width:
        raise SpecError(f"model {name}: adapter_config.text_hidden_size {ac['text_hidden_size']!r} is not the text "
                        f"width {width}; Molmo2Model.get_placeholder_mask raises on image features of another width "
                        "(the class defaults, 3584 and 4096, disagree: set it)")
    layers = ac["vision_feature_layer"] or list(DEFAULT_FEATURE_LAYERS)
    return Molmo2TowerSpec(
        model_type="molmo2", depth=vc["num_hidden_layers"], hidden_size=vc["hidden_size"],
        intermediate_size=vc["intermediate_size"], num_heads=vc["num_attention_heads"],
        in_channels=vc["num_channels"], patch_size=vc["patch_size"], out_hidden_size=width,
        hidden_act=str(vc["hidden_act"]), image_size=size[0], feature_layers=tuple(layers),
        adapter_hidden=ac["hidden_size"], adapter_heads=ac["num_attention_heads"],
        adapter_intermediate=ac["intermediate_size"], attention_bias=bool(vc["attention_bias"]),
        adapter_bias=bool(ac["attention_bias"]))

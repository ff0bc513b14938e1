"""InternVLTowerSpec: InternVL's vision tower (InternViT), its pixel-shuffle projector and the GotOcr2-style tiling of
its image processor, as the internvl config.json's `vision_config` and outer keys describe them (transformers 5.24).

- The tower (models/internvl/modeling_internvl.py `InternVLVisionModel`): `InternVLVisionEmbeddings` (a learned
  `cls_token`, a Conv2d patch embedding with bias, kernel = stride = patch_size, `patch_embeddings.projection`; a
  `mask_token` when use_mask_token; an absolute position table of (image_size / patch_size)² + 1 rows when
  use_absolute_position_embeddings), `num_hidden_layers` `InternVLVisionLayer`s (layernorm_before → attention:
  q/k/v_proj with biases when attention_bias, an RMSNorm over the width on q and on k when use_qk_norm,
  `projection_layer` with bias → × lambda_1 (layer scale) + residual → layernorm_after → mlp.fc1 → hidden_act →
  mlp.fc2, both with bias → × lambda_2 + residual; the norms LayerNorm or InternVLVisionRMSNorm per norm_type) and
  `layernorm` (nn.Identity when use_mean_pooling, else a LayerNorm). Its `get_input_embeddings` is
  `embeddings.patch_embeddings`.
- The projector (`InternVLMultiModalProjector`): LayerNorm over width · (1 / downsample_ratio)², linear_1 (→ text
  width) → projector_hidden_act → linear_2 (text width → text width), both with bias.
- The model (`InternVLModel.get_image_features`): pixel_values [tiles, 3, image_size, image_size] in the weight dtype,
  the tower over every tile, the feature layer's output (-1: `last_hidden_state`), the class token dropped
  ("default"), the patch grid reshaped to its square and `pixel_shuffle`d by downsample_ratio (views, two permute +
  contiguous copies), then the projector: (image_size / patch_size)² · downsample_ratio² image tokens per tile.
- The image processor (models/got_ocr2/image_processing_pil_got_ocr2.py `GotOcr2ImageProcessorPil._preprocess`):
  with crop_to_patches and max_patches > 1, `crop_image_to_patches` resizes the image to the columns × rows canvas
  whose aspect ratio is closest to the image's among those of min_patches..max_patches tiles
  (`get_optimal_tiled_canvas`), cuts it into tiles of `size`, and adds a thumbnail (the image resized to one tile)
  when there is more than one; else the image is resized to one tile. The processor
  (processing_internvl.py `InternVLProcessor.replace_image_token`) writes <img>, image_seq_length · tiles
  <IMG_CONTEXT> tokens and </img> per image.

Where the processor's settings come from: the config dict's own `crop_to_patches`, `min_patches`, `max_patches` (the
names of the image processor's preprocessor_config.json keys, which a config.json does not carry); omitted, what
InternVLProcessor runs: its class attribute `images_kwargs = {"crop_to_patches": True}` is merged into every call
(processing_utils.py `ProcessorMixin._merge_kwargs`, step 7) over the image processor's own False, and min_patches 1,
max_patches 12 are the GotOcr2ImageProcessor class defaults. The tile is the vision config's image_size (InternVL's
processors use size {"height": 448, "width": 448} with 448-px towers).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, ClassVar

from hpcmem.errors import Problems, SpecError
from hpcmem.models.clip_tower import ClipTowerSpec, drops_class_token, feature_layer
from hpcmem.models.tower_base import TowerLinear, encoder_layer_linears, text_width

# InternVLVisionConfig's class defaults (configuration_internvl.py)
INTERNVL_VISION_DEFAULTS: dict[str, Any] = {
    "hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16, "attention_bias": False,
    "use_qk_norm": False, "intermediate_size": 4096, "hidden_act": "gelu", "norm_type": "layer_norm",
    "image_size": 448, "patch_size": 14, "num_channels": 3, "use_mask_token": False,
    "use_absolute_position_embeddings": True, "use_mean_pooling": True}
# InternVLConfig's own defaults
INTERNVL_DEFAULTS: dict[str, Any] = {"downsample_ratio": 0.5, "projector_hidden_act": "gelu",
                                     "vision_feature_layer": -1, "vision_feature_select_strategy": "default"}
# what InternVLProcessor's call runs with (processing_internvl.py `images_kwargs`; image_processing_pil_got_ocr2.py
# GotOcr2ImageProcessorPil's min_patches, max_patches)
PROCESSOR_DEFAULTS: dict[str, Any] = {"crop_to_patches": True, "min_patches": 1, "max_patches": 12}
QWEN2_HIDDEN = 4096         # Qwen2Config.hidden_size: InternVLConfig's text_config default is a qwen2
INTERNVL_ACTIVATIONS = ("gelu",)


@dataclass(frozen=True, kw_only=True)
class InternVLTowerSpec(ClipTowerSpec):
    """An InternViT tower and InternVL's projector; `tile` is the processor's tile side (the tower's image_size)."""

    attention_bias: bool
    norm_type: str
    use_qk_norm: bool
    use_mask_token: bool
    use_positions: bool
    use_mean_pooling: bool
    scale_factor: int           # int(1 / downsample_ratio)
    crop_to_patches: bool
    min_patches: int
    max_patches: int
    fixed_resolution: bool = False
    drop_path_rate: float = 0.0     # stochastic depth's top rate (QianfanOCRVisionLayer's DropPath; InternVL: none)
    family: str = "internvl"
    activations: ClassVar[tuple[str, ...]] = INTERNVL_ACTIVATIONS

    def __post_init__(self) -> None:
        super().__post_init__()
        p = Problems()
        p.check(self.norm_type in ("layer_norm", "rms_norm"),
                f"vision_config.norm_type must be layer_norm or rms_norm, got {self.norm_type!r}")
        p.check(isinstance(self.scale_factor, int) and self.scale_factor >= 1,
                "downsample_ratio must be 1 / an integer ≥ 1 (InternVLMultiModalProjector's width is "
                "hidden_size · int(1 / downsample_ratio)²)")
        p.check(1 <= self.min_patches <= self.max_patches,
                f"min_patches {self.min_patches} and max_patches {self.max_patches}: need 1 ≤ min ≤ max")
        p.raise_if_any()

    @property
    def tile(self) -> int:
        return self.image_size

    @property
    def shuffle_problem(self) -> str | None:
        """Why images fail, or None: InternVLModel.pixel_shuffle needs the square patch grid's side a multiple of
        1 / downsample_ratio, and the feature rows a square grid (the class token dropped: "default")."""
        side = self.image_size // self.patch_size
        if not self.drop_class_token:
            return ("vision_feature_select_strategy 'full': InternVLModel.get_image_features keeps the class token, "
                    f"and {side}² + 1 rows are no square grid: its reshape fails on images")
        if side % self.scale_factor:
            return (f"image_size {self.image_size} / patch_size {self.patch_size} = {side} patches a side, not a "
                    f"multiple of 1 / downsample_ratio {self.scale_factor}: InternVLModel.pixel_shuffle raises")
        return None

    @property
    def tokens_per_image(self) -> int:
        """Image tokens per tile: (image_size / patch_size)² / scale_factor² (the projector's rows per tile)."""
        return self.patches // self.scale_factor ** 2

    @property
    def merged_width(self) -> int:
        return self.hidden_size * self.scale_factor ** 2

    @property
    def norm_params(self) -> int:
        """One norm over the tower width: LayerNorm a weight and a bias, InternVLVisionRMSNorm a weight."""
        return self.hidden_size * (2 if self.norm_type == "layer_norm" else 1)

    def linears(self) -> tuple[TowerLinear, ...]:
        h, i, d, o, m = self.hidden_size, self.intermediate_size, self.depth, self.out_hidden_size, self.merged_width
        # InternVLVisionAttention: q/k/v_proj with bias=attention_bias, projection_layer always with bias
        layer = encoder_layer_linears(h, i, d, out_proj="projection_layer", attention_bias=self.attention_bias,
                                      attention="attention", out_bias=True)
        return (*layer,
                TowerLinear(name="linear_1", in_features=m, out_features=o, count=1, part="merger"),
                TowerLinear(name="linear_2", in_features=o, out_features=o, count=1, part="merger"))

    @property
    def block_params(self) -> int:
        """One InternVLVisionLayer: its six linears, two norms, lambda_1 and lambda_2 (the width each) and, with
        use_qk_norm, q_norm and k_norm (RMSNorms over the width)."""
        linear = sum(x.params for x in self.linears() if x.part == "tower") // self.depth
        h = self.hidden_size
        return linear + 2 * self.norm_params + 2 * h + (2 * h if self.use_qk_norm else 0)

    @property
    def positions(self) -> int:
        """Rows the tower runs per tile: the patches and the class token."""
        return self.patches + 1

    @property
    def embed_params(self) -> int:
        """cls_token, mask_token (use_mask_token), the Conv2d patch embedding with bias and the position table."""
        h = self.hidden_size
        return (h + (h if self.use_mask_token else 0) + self.patch_dim * h + h
                + (self.positions * h if self.use_positions else 0))

    @property
    def pre_norm_params(self) -> int:
        return 0

    @property
    def post_norm_params(self) -> int:
        """`layernorm` after the layers: a LayerNorm unless use_mean_pooling (nn.Identity)."""
        return 0 if self.use_mean_pooling else 2 * self.hidden_size

    @property
    def tower_params(self) -> int:
        return self.embed_params + self.block_params * self.depth + self.post_norm_params

    @property
    def merger_params(self) -> int:
        """The projector's LayerNorm over the merged width and its two linears."""
        return 2 * self.merged_width + sum(x.params for x in self.linears() if x.part == "merger")

    @property
    def unused_params(self) -> int:
        """Off the loss's path: the layers after the feature layer and, unless the feature layer is the last,
        `layernorm`."""
        tail = 0 if self.feature_layer in (-1, self.depth) else self.post_norm_params
        return (self.depth - self.trained_layers) * self.block_params + tail

    def tiles(self, height: int, width: int) -> tuple[int, int, int]:
        """(tiles, columns, rows) of one image (`internvl_tiles`)."""
        return internvl_tiles(height, width, self.tile, self.min_patches, self.max_patches, self.crop_to_patches)


@lru_cache(maxsize=256)
def optimal_canvas(height: int, width: int, tile: int, min_patches: int, max_patches: int) -> tuple[int, int]:
    """image_processing_pil_got_ocr2.py `get_optimal_tiled_canvas`, line for line: (columns, rows) of the arrangement
    of min..max tiles (`get_all_supported_aspect_ratios`: width-major, sorted by tile count) whose columns / rows is
    closest to width / height; on a tie the later one when the image's area exceeds half the canvas's."""
    grids = sorted(((c, r) for c in range(1, max_patches + 1) for r in range(1, max_patches + 1)
                    if min_patches <= c * r <= max_patches), key=lambda g: g[0] * g[1])
    aspect, area = width / height, width * height
    best_diff, best = float("inf"), (1, 1)
    for c, r in grids:
        diff = abs(aspect - c / r)
        if diff < best_diff:
            best_diff, best = diff, (c, r)
        elif diff == best_diff and area > 0.5 * tile * tile * c * r:
            best = (c, r)
    return best


def internvl_tiles(height: int, width: int, tile: int, min_patches: int, max_patches: int,
                   crop: bool) -> tuple[int, int, int]:
    """(tiles, columns, rows) of one image of height × width pixels (GotOcr2ImageProcessorPil._preprocess): with
    crop_to_patches and max_patches > 1, the optimal canvas's columns × rows tiles plus a thumbnail when more than
    one (`crop_image_to_patches`, use_thumbnail True); else one tile."""
    if not crop or max_patches <= 1:
        return 1, 1, 1
    cols, rows = optimal_canvas(height, width, tile, min_patches, max_patches)
    return cols * rows + (1 if cols * rows > 1 else 0), cols, rows


def internvl_tower_from_config(cfg: dict[str, Any], name: str, model_type: str = "internvl",
                               defaults: dict[str, Any] | None = None) -> InternVLTowerSpec:
    """The InternVLTowerSpec of an internvl config.json dict (or of a type whose tower is InternViT's, `model_type`
    with its vision config class's `defaults`); keys it omits take the config classes' defaults and the processor's
    the GotOcr2ImageProcessor class defaults (module docstring)."""
    raw = cfg.get("vision_config") or {}
    if not isinstance(raw, dict):
        raise SpecError(f"model {name}: vision_config must be an object, got {type(raw).__name__}")
    vision_type = f"{model_type}_vision"
    if raw.get("model_type", vision_type) != vision_type:
        raise SpecError(f"model {name}: {model_type}'s vision_config.model_type {raw.get('model_type')!r} is not "
                        f"modelled; hpcmem models {model_type} with its InternViT tower ({vision_type})")
    vc = {**(INTERNVL_VISION_DEFAULTS if defaults is None else defaults), **raw}
    for key in ("image_size", "patch_size"):
        value = vc[key]
        if isinstance(value, (list, tuple)):
            if len(value) != 2 or value[0] != value[1]:
                raise SpecError(f"model {name}: vision_config.{key} {value!r}: hpcmem models square tiles")
            vc[key] = value[0]
    outer = {**INTERNVL_DEFAULTS, **{k: cfg[k] for k in INTERNVL_DEFAULTS if k in cfg}}
    layer, drop = feature_layer(outer, name), drops_class_token(outer, name)
    ratio = outer["downsample_ratio"]
    if not isinstance(ratio, (int, float)) or isinstance(ratio, bool) or not 0 < ratio <= 1:
        raise SpecError(f"model {name}: downsample_ratio must be a number in (0, 1], got {ratio!r}")
    proc = {**PROCESSOR_DEFAULTS, **{k: cfg[k] for k in PROCESSOR_DEFAULTS if k in cfg}}
    rate = vc.get("drop_path_rate", 0.0)
    if not isinstance(rate, (int, float)) or isinstance(rate, bool) or not 0 <= rate < 1:
        raise SpecError(f"model {name}: vision_config.drop_path_rate must be a number in [0, 1), got {rate!r}")
    return InternVLTowerSpec(
        model_type=model_type, drop_path_rate=float(rate), depth=vc["num_hidden_layers"], hidden_size=vc["hidden_size"],
        intermediate_size=vc["intermediate_size"], num_heads=vc["num_attention_heads"], in_channels=vc["num_channels"],
        image_size=vc["image_size"], patch_size=vc["patch_size"], out_hidden_size=text_width(cfg, QWEN2_HIDDEN),
        hidden_act=str(vc["hidden_act"]), projector_act=str(outer["projector_hidden_act"]), projector_bias=True,
        feature_layer=layer, drop_class_token=drop, attention_bias=bool(vc["attention_bias"]),
        norm_type=str(vc["norm_type"]), use_qk_norm=bool(vc["use_qk_norm"]), use_mask_token=bool(vc["use_mask_token"]),
        use_positions=bool(vc["use_absolute_position_embeddings"]), use_mean_pooling=bool(vc["use_mean_pooling"]),
        scale_factor=int(1 / ratio), crop_to_patches=bool(proc["crop_to_patches"]),
        min_patches=proc["min_patches"], max_patches=proc["max_patches"])

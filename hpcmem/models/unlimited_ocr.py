"""UnlimitedOcrTowerSpec: Unlimited-OCR's (model_type "unlimited_ocr") vision part — DeepSeek-OCR 2's SAM tower with
its neck and two downsampling convolutions, a CLIP encoder over the SAM features, and a Linear projector over both —
as its config.json's `vision_config` and `text_config` describe them, their linears, parameter count and image
tokens (transformers 5.24 models/unlimited_ocr/modular_unlimited_ocr.py).

- The config (`UnlimitedOcrConfig(DeepseekOcr2Config)`): `sam_config` an `UnlimitedOcrSamVisionConfig`
  (GotOcr2VisionConfig's class defaults: SAM ViT-B, 768 wide, 12 layers, window 14, global layers 2/5/8/11, 1024 px,
  16 px patches, mlp_dim 3072, neck to 256; `downsample_channels` (512, 1024)), `encoder_config` an
  `UnlimitedOcrVisionEncoderConfig` (CLIP ViT-L's: 1024 wide, MLP 4096, 24 layers, 16 heads, quick_gelu, image_size
  224 / patch 14: a 257-row position table); `text_config` an UnlimitedOcrTextConfig (the learned text part); image
  token 128815, head untied.
- The vision model (`UnlimitedOcrVisionModel.forward`): SAM (DeepSeek-OCR 2's, hpcmem.models.deepseek_ocr2) gives
  [views, 1024, g, g] (g = 16 at 1024 px, 10 at 640); `UnlimitedOcrVisionEncoder` takes it as its patch embeddings
  (`UnlimitedOcrVisionEmbeddings`: a class token, the position table bicubically interpolated to g × g),
  `pre_layrnorm`, the CLIP encoder layers (q/k/v/out_proj and fc1/fc2 with biases, two LayerNorms; no post-norm);
  its rows but the class token `torch.cat` with the SAM features: [views, g², 1024 + downsample_channels[-1]].
- The projector (`UnlimitedOcrModel.multi_modal_projector`): Linear(that width → text width, bias); `image_newline`
  after each row of features and `view_separator` after each image.
- The processor (processing_unlimited_ocr.py `UnlimitedOcrProcessor`; its torchvision-only
  `UnlimitedOcrImageProcessor`): a 1024 px global view (padded to a square) and, for an image whose longest side
  exceeds `tile_size` 640, GotOcr2's canvas of 2 .. 32 tiles of 640 px; `replace_image_token`: 16 · (16 + 1) + 1
  tokens, and rows · 10 · (columns · 10 + 1) more for the tiles.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from hpcmem.errors import Problems, SpecError
from hpcmem.models.deepseek_ocr2 import (DOWNSAMPLE, GLOBAL_SIZE, PROCESSOR_PATCH, DeepseekOcr2TowerSpec,
                                         sub_config)
from hpcmem.models.internvl import optimal_canvas
from hpcmem.models.tower_base import TowerLinear, check_counts, check_heads, text_width

# UnlimitedOcrSamVisionConfig's class defaults (GotOcr2VisionConfig's fields, downsample_channels its own)
SAM_DEFAULTS: dict[str, Any] = {
    "hidden_size": 768, "output_channels": 256, "num_hidden_layers": 12, "num_attention_heads": 12,
    "num_channels": 3, "image_size": 1024, "patch_size": 16, "hidden_act": "gelu", "qkv_bias": True,
    "use_abs_pos": True, "use_rel_pos": True, "window_size": 14, "global_attn_indexes": (2, 5, 8, 11),
    "mlp_dim": 3072, "downsample_channels": (512, 1024)}
# UnlimitedOcrVisionEncoderConfig's class defaults (CLIP ViT-L's)
ENCODER_DEFAULTS: dict[str, Any] = {
    "hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24, "num_attention_heads": 16,
    "image_size": 224, "patch_size": 14, "hidden_act": "quick_gelu"}
TEXT_HIDDEN = 1280          # UnlimitedOcrTextConfig.hidden_size: an omitted text_config's width
# UnlimitedOcrImageProcessor's class attributes (its size and min_patches DeepseekOcr2ImageProcessor's)
TILE_SIZE, MIN_TILES, MAX_TILES = 640, 2, 32


@dataclass(frozen=True, kw_only=True)
class UnlimitedOcrTowerSpec(DeepseekOcr2TowerSpec):
    """The CLIP encoder (the inherited depth, hidden_size, intermediate_size, num_heads) over DeepSeek-OCR 2's SAM
    tower (the sam_ fields), under the Linear projector; `position_grid` is the encoder's own position table's side
    (image_size / patch_size)."""

    position_grid: int
    family: str = "unlimited_ocr"
    norm: str = "layer"
    mlp: str = "fc"

    def __post_init__(self) -> None:
        p = Problems()
        check_counts(p, self, ("sam_depth", "sam_hidden", "sam_mlp", "sam_heads", "sam_channels", "sam_image_size",
                               "window_size"), prefix="vision_config.sam_config.")
        check_counts(p, self, ("depth", "hidden_size", "intermediate_size", "num_heads", "position_grid"),
                     prefix="vision_config.encoder_config.")
        p.raise_if_any()
        check_heads(p, self.hidden_size, self.num_heads, "num_attention_heads")
        p.check(self.sam_hidden % self.sam_heads == 0,
                f"vision_config.sam_config.hidden_size {self.sam_hidden} is not a multiple of num_attention_heads "
                f"{self.sam_heads}")
        p.check(self.patch_size == PROCESSOR_PATCH,
                f"vision_config.sam_config.patch_size {self.patch_size}: UnlimitedOcrProcessor counts image tokens "
                f"at {PROCESSOR_PATCH} px patches (its patch_size), so any other leaves the tokens and the features "
                "apart")
        p.check(self.downsample_channels[1] == self.hidden_size,
                f"vision_config.sam_config.downsample_channels[-1] {self.downsample_channels[1]} must equal "
                f"encoder_config.hidden_size {self.hidden_size}: UnlimitedOcrVisionEmbeddings takes the SAM "
                "features as its patch embeddings")
        p.check(self.hidden_act == "quick_gelu", f"vision_config.encoder_config.hidden_act {self.hidden_act!r}: "
                                                 "what it keeps for backward is derived only for quick_gelu")
        p.raise_if_any()

    def tiles(self, height: int, width: int) -> int:
        """UnlimitedOcrImageProcessor._preprocess: none unless the longest side exceeds 640, else GotOcr2's canvas
        of 2 .. 32 tiles."""
        if max(height, width) <= TILE_SIZE:
            return 0
        cols, rows = self.canvas(height, width)
        return cols * rows

    @staticmethod
    def canvas(height: int, width: int) -> tuple[int, int]:
        return optimal_canvas(height, width, TILE_SIZE, MIN_TILES, MAX_TILES)

    def image_tokens(self, height: int, width: int) -> int:
        """processing_unlimited_ocr.py `replace_image_token`: the global view's rows with a newline each and one
        separator, and the tiles' rows (rows · 10 of them, columns · 10 wide) with a newline each."""
        g = math.ceil(GLOBAL_SIZE // PROCESSOR_PATCH / DOWNSAMPLE)
        q = math.ceil(TILE_SIZE // PROCESSOR_PATCH / DOWNSAMPLE)
        tokens = g * (g + 1) + 1
        if self.tiles(height, width):
            cols, rows = self.canvas(height, width)
            tokens += rows * q * (cols * q + 1)
        return tokens

    def image_patches(self, height: int, width: int) -> int:
        return (GLOBAL_SIZE // self.patch_size) ** 2 + self.tiles(height, width) * (TILE_SIZE // self.patch_size) ** 2

    def linears(self) -> tuple[TowerLinear, ...]:
        """SAM's per layer (part "sam"), the CLIP encoder's per layer (part "encoder"), the projector ("merger")."""
        sam = tuple(x for x in super().linears() if x.part == "sam")
        h, i, d = self.hidden_size, self.intermediate_size, self.depth
        return (*sam,
                *(TowerLinear(name=f"self_attn.{n}", in_features=h, out_features=h, count=d, part="encoder")
                  for n in ("q_proj", "k_proj", "v_proj", "out_proj")),
                TowerLinear(name="mlp.fc1", in_features=h, out_features=i, count=d, part="encoder"),
                TowerLinear(name="mlp.fc2", in_features=i, out_features=h, count=d, part="encoder"),
                TowerLinear(name="multi_modal_projector", in_features=self.merged_width,
                            out_features=self.out_hidden_size, count=1, part="merger"))

    @property
    def merged_width(self) -> int:
        """The projector's input: the encoder's rows beside the SAM features."""
        return self.hidden_size + self.downsample_channels[1]

    @property
    def block_params(self) -> int:
        """One CLIP encoder layer: its six linears and two LayerNorms."""
        return sum(x.params // x.count for x in self.linears() if x.part == "encoder") + 4 * self.hidden_size

    @property
    def queries_params(self) -> int:
        """The encoder's embeddings (the class token, the position table) and pre_layrnorm in place of queries."""
        return self.hidden_size * (1 + 1 + self.position_grid ** 2) + 2 * self.hidden_size

    @property
    def tower_params(self) -> int:
        return self.sam_params + self.depth * self.block_params + self.queries_params

    @property
    def merger_params(self) -> int:
        """The projector Linear, image_newline and view_separator."""
        return self.merged_width * self.out_hidden_size + 3 * self.out_hidden_size


def unlimited_ocr_tower_from_config(cfg: dict[str, Any], name: str) -> UnlimitedOcrTowerSpec:
    """The UnlimitedOcrTowerSpec of an unlimited_ocr config.json dict; keys it omits take the config classes'
    defaults."""
    raw = cfg.get("vision_config")
    if raw is not None and not isinstance(raw, dict):
        raise SpecError(f"model {name}: vision_config must be an object, got {type(raw).__name__}")
    sc = {**SAM_DEFAULTS, **sub_config((raw or {}).get("sam_config"), "sam_config", name)}
    ec = {**ENCODER_DEFAULTS, **sub_config((raw or {}).get("encoder_config"), "encoder_config", name)}
    for key, value in (("sam_config.image_size", sc["image_size"]), ("sam_config.patch_size", sc["patch_size"]),
                       ("encoder_config.image_size", ec["image_size"]),
                       ("encoder_config.patch_size", ec["patch_size"])):
        if isinstance(value, (list, tuple)):
            raise SpecError(f"model {name}: vision_config.{key} {value!r}: hpcmem models square images (an integer)")
    if not sc["use_abs_pos"] or not sc["use_rel_pos"]:
        raise SpecError(f"model {name}: vision_config.sam_config use_abs_pos/use_rel_pos false: hpcmem derives the "
                        "SAM attention with relative positions and the absolute table (the class defaults)")
    ds = sc["downsample_channels"]
    if not isinstance(ds, (list, tuple)) or len(ds) != 2:
        raise SpecError(f"model {name}: vision_config.sam_config.downsample_channels {ds!r} must be two channel "
                        "counts")
    gl = tuple(int(x) for x in (sc["global_attn_indexes"] or ()) if 0 <= int(x) < sc["num_hidden_layers"])
    return UnlimitedOcrTowerSpec(
        model_type="unlimited_ocr", depth=ec["num_hidden_layers"], hidden_size=ec["hidden_size"],
        intermediate_size=ec["intermediate_size"], num_heads=ec["num_attention_heads"],
        encoder_kv_heads=ec["num_attention_heads"], in_channels=sc["num_channels"], patch_size=sc["patch_size"],
        out_hidden_size=text_width(cfg, TEXT_HIDDEN), hidden_act=str(ec["hidden_act"]),
        sam_depth=sc["num_hidden_layers"], sam_hidden=sc["hidden_size"], sam_mlp=sc["mlp_dim"],
        sam_heads=sc["num_attention_heads"], sam_channels=sc["output_channels"],
        downsample_channels=(int(ds[0]), int(ds[1])), sam_image_size=sc["image_size"],
        window_size=sc["window_size"], global_layers=gl, sam_qkv_bias=bool(sc["qkv_bias"]),
        use_abs_pos=bool(sc["use_abs_pos"]), use_rel_pos=bool(sc["use_rel_pos"]),
        position_grid=ec["image_size"] // ec["patch_size"])

"""DeepseekOcr2TowerSpec: DeepSeek-OCR 2's (model_type "deepseek_ocr2") vision part — a SAM ViT-B tower with its neck
and two downsampling convolutions, a Qwen2 decoder run as an encoder over the SAM features and learned queries, and
a Linear projector — as its config.json's `vision_config` and `text_config` describe them, their linears, parameter
count and image tokens (transformers 5.24 models/deepseek_ocr2/modular_deepseek_ocr2.py).

- The config (`DeepseekOcr2Config`): `vision_config` is a `DeepseekOcr2VisionConfig` of two sub-configs:
  `sam_config` (`DeepseekOcr2SamVisionConfig`, SamVisionConfig's class defaults: width 768, 12 layers, 12 heads,
  image_size 1024, 16 px patches, window 14, global_attn_indexes (2, 5, 8, 11), mlp_dim 4 · width, output_channels
  256, downsample_channels [512, 896]) and `encoder_config` (`DeepseekOcr2VisionEncoderConfig`, Qwen2Config's class
  defaults: width 4096, MLP 22016, 32 layers, 32 heads and key/value heads); `text_config` a DeepseekOcr2TextConfig
  (the learned text part, hpcmem.models.vlm_learned); image_token_id 128815, tie_word_embeddings False.
- The SAM tower (`DeepseekOcr2SamVisionEncoder`, SamVisionEncoder's layers, `DeepseekOcr2SamVisionSdpaAttention`):
  a Conv2d patch embedding (bias), the position table [1, G, G, width] (G = image_size / patch_size, bicubically
  interpolated to another grid), the layers (qkv, proj, lin1, lin2 Linears with biases, two LayerNorms, rel_pos_h /
  rel_pos_w [2·S − 1, head_dim], S the window or G on a global layer), the neck (`SamVisionNeck`: conv1 1 × 1 →
  output_channels, a channels-first LayerNorm, conv2 3 × 3, a LayerNorm, no biases) and `DeepseekOcr2SamVisionProj`
  (conv1 3 × 3 / 2 → downsample_channels[0], conv2 3 × 3 / 2 → downsample_channels[1], no biases): a 1024 px view
  gives 64² patches and 16² features, a 768 px tile 48² and 12².
- The encoder (`DeepseekOcr2VisionModel.forward`): the features flattened, the learned queries appended
  (`query_768_resolution` [144, width] when the features are at most 144, else `query_1024_resolution` [256, width]),
  through `DeepseekOcr2VisionEncoder` (Qwen2Model's layers without embed_tokens: q/k/v with biases, o_proj, gate/up/
  down_proj, RMSNorms, a final norm) under a mask bidirectional over the features and causal over the queries;
  the queries' rows are the output. Its width must be downsample_channels[1] (the concatenation).
- The projector (`DeepseekOcr2Model.multi_modal_projector`): Linear(encoder width → text width, bias), and
  `view_separator` [text width] appended after each image's rows.
- The processor (processing_deepseek_ocr2.py `DeepseekOcr2Processor`, image_processing_pil_deepseek_ocr2.py
  `DeepseekOcr2ImageProcessorPil`): a global view (the longest edge resized to `size` 1024, padded to a square) and,
  for an image whose longest side exceeds `tile_size` 768, GotOcr2's `get_optimal_tiled_canvas` of min_patches 2 ..
  max_patches 6 tiles of 768 px; `replace_image_token`: ⌈1024 / 16 / 4⌉² + ⌈768 / 16 / 4⌉² · tiles + 1 tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from hpcmem.errors import Problems, SpecError
from hpcmem.models.internvl import optimal_canvas
from hpcmem.models.tower_base import TowerBase, TowerLinear, check_counts, check_heads, text_width

# DeepseekOcr2SamVisionConfig's class defaults (configuration_deepseek_ocr2.py, SamVisionConfig's fields)
SAM_DEFAULTS: dict[str, Any] = {
    "hidden_size": 768, "output_channels": 256, "num_hidden_layers": 12, "num_attention_heads": 12,
    "num_channels": 3, "image_size": 1024, "patch_size": 16, "hidden_act": "gelu", "qkv_bias": True,
    "mlp_ratio": 4.0, "use_abs_pos": True, "use_rel_pos": True, "window_size": 14,
    "global_attn_indexes": (2, 5, 8, 11), "mlp_dim": None, "downsample_channels": None}
# DeepseekOcr2VisionEncoderConfig's class defaults (Qwen2Config's)
ENCODER_DEFAULTS: dict[str, Any] = {
    "hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 32, "hidden_act": "silu", "use_sliding_window": False}
TEXT_HIDDEN = 4096          # DeepseekOcr2TextConfig.hidden_size: an omitted text_config's width
# DeepseekOcr2ImageProcessor(Pil)'s class attributes and DeepseekOcr2Processor's __init__ defaults
GLOBAL_SIZE, TILE_SIZE, MIN_TILES, MAX_TILES = 1024, 768, 2, 6
PROCESSOR_PATCH, DOWNSAMPLE = 16, 4
# DeepseekOcr2VisionModel.__init__: nn.Embedding(144, width) and nn.Embedding(256, width)
QUERIES_768, QUERIES_1024 = 144, 256


def down(side: int) -> int:
    """A 3 × 3, stride 2, padding 1 Conv2d's output side (DeepseekOcr2SamVisionProj's conv1 and conv2)."""
    return (side + 2 - 3) // 2 + 1


@dataclass(frozen=True)
class SamView:
    """The SAM tower at one input size (the 1024 px global view or the 768 px tiles), in the names
    hpcmem.estimate.vision_deepseek_vl_hybrid's SAM layer reads."""

    sam_hidden: int
    sam_heads: int
    sam_mlp: int
    sam_grid: int
    window_size: int
    global_layers: tuple[int, ...]
    use_rel_pos: bool

    def sam_global(self, layer: int) -> bool:
        return layer in self.global_layers

    @property
    def sam_windows(self) -> int:
        padded = -(-self.sam_grid // self.window_size) * self.window_size
        return (padded // self.window_size) ** 2


@dataclass(frozen=True, kw_only=True)
class DeepseekOcr2TowerSpec(TowerBase):
    """The Qwen2 encoder (the inherited fields: depth, hidden_size, intermediate_size, num_heads) over the SAM tower
    (the sam_ fields), under the Linear projector; `out_hidden_size` is the text width."""

    encoder_kv_heads: int
    sam_depth: int
    sam_hidden: int
    sam_mlp: int
    sam_heads: int
    sam_channels: int
    downsample_channels: tuple[int, int]
    sam_image_size: int
    window_size: int
    global_layers: tuple[int, ...]
    sam_qkv_bias: bool = True
    use_abs_pos: bool = True
    use_rel_pos: bool = True
    norm: str = "rms"
    mlp: str = "gated"
    hooked_input: bool = False
    fixed_resolution: bool = False
    deepstack_visual_indexes: tuple[int, ...] = ()
    image_size: int = GLOBAL_SIZE
    family: str = "deepseek_ocr2"

    def __post_init__(self) -> None:
        p = Problems()
        check_counts(p, self, ("sam_depth", "sam_hidden", "sam_mlp", "sam_heads", "sam_channels", "sam_image_size",
                               "window_size"), prefix="vision_config.sam_config.")
        check_counts(p, self, ("depth", "hidden_size", "intermediate_size", "num_heads", "encoder_kv_heads"),
                     prefix="vision_config.encoder_config.")
        p.raise_if_any()
        check_heads(p, self.hidden_size, self.num_heads, "num_attention_heads")
        p.check(self.num_heads % self.encoder_kv_heads == 0,
                f"vision_config.encoder_config.num_attention_heads {self.num_heads} is not a multiple of "
                f"num_key_value_heads {self.encoder_kv_heads}")
        p.check(self.sam_hidden % self.sam_heads == 0,
                f"vision_config.sam_config.hidden_size {self.sam_hidden} is not a multiple of num_attention_heads "
                f"{self.sam_heads}")
        p.check(self.sam_image_size % self.patch_size == 0,
                f"vision_config.sam_config.image_size {self.sam_image_size} is not a multiple of patch_size "
                f"{self.patch_size}")
        p.check(self.patch_size == PROCESSOR_PATCH,
                f"vision_config.sam_config.patch_size {self.patch_size}: DeepseekOcr2Processor counts image tokens "
                f"at {PROCESSOR_PATCH} px patches (its patch_size), so any other leaves the tokens and the features "
                "apart")
        p.check(self.downsample_channels[1] == self.hidden_size,
                f"vision_config.sam_config.downsample_channels[1] {self.downsample_channels[1]} must equal "
                f"encoder_config.hidden_size {self.hidden_size}: DeepseekOcr2VisionModel concatenates the SAM "
                "features with the encoder's queries")
        p.check(self.hidden_act == "silu", f"vision_config.encoder_config.hidden_act {self.hidden_act!r}: what it "
                                           "keeps for backward is derived only for silu")
        p.raise_if_any()

    # -- geometry
    def view(self, size: int) -> SamView:
        """The SAM tower run on `size` px squares."""
        return SamView(sam_hidden=self.sam_hidden, sam_heads=self.sam_heads, sam_mlp=self.sam_mlp,
                       sam_grid=size // self.patch_size, window_size=self.window_size,
                       global_layers=self.global_layers, use_rel_pos=self.use_rel_pos)

    @staticmethod
    def features(size: int) -> int:
        """SAM's feature rows of a `size` px square after the neck and the two stride-2 convolutions."""
        return down(down(size // PROCESSOR_PATCH)) ** 2

    def tiles(self, height: int, width: int) -> int:
        """Local tiles of an image: none unless its longest side exceeds tile_size, else the columns × rows of
        GotOcr2's `get_optimal_tiled_canvas` (image_processing_pil_deepseek_ocr2.py `_preprocess`)."""
        if max(height, width) <= TILE_SIZE:
            return 0
        cols, rows = optimal_canvas(height, width, TILE_SIZE, MIN_TILES, MAX_TILES)
        return cols * rows

    def image_tokens(self, height: int, width: int) -> int:
        """processing_deepseek_ocr2.py `replace_image_token`: the global view's, each tile's, and one separator."""
        g = math.ceil(GLOBAL_SIZE / PROCESSOR_PATCH / DOWNSAMPLE) ** 2
        t = math.ceil(TILE_SIZE / PROCESSOR_PATCH / DOWNSAMPLE) ** 2
        return g + t * self.tiles(height, width) + 1

    def image_patches(self, height: int, width: int) -> int:
        """SAM patch rows of an image: the global view's and its tiles'."""
        return (GLOBAL_SIZE // self.patch_size) ** 2 + self.tiles(height, width) * (TILE_SIZE // self.patch_size) ** 2

    # -- parameters
    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def sam_grid(self) -> int:
        return self.sam_image_size // self.patch_size

    def linears(self) -> tuple[TowerLinear, ...]:
        """Every nn.Linear of the vision part: SAM's per layer (part "sam"), the encoder's per layer (part
        "encoder") and the projector (part "merger")."""
        sh, sm, sd = self.sam_hidden, self.sam_mlp, self.sam_depth
        h, i, d, kv = self.hidden_size, self.intermediate_size, self.depth, self.encoder_kv_heads * self.head_dim
        return (TowerLinear(name="attn.qkv", in_features=sh, out_features=3 * sh, count=sd, part="sam",
                            bias=self.sam_qkv_bias),
                TowerLinear(name="attn.proj", in_features=sh, out_features=sh, count=sd, part="sam"),
                TowerLinear(name="mlp.lin1", in_features=sh, out_features=sm, count=sd, part="sam"),
                TowerLinear(name="mlp.lin2", in_features=sm, out_features=sh, count=sd, part="sam"),
                TowerLinear(name="self_attn.q_proj", in_features=h, out_features=h, count=d, part="encoder"),
                TowerLinear(name="self_attn.k_proj", in_features=h, out_features=kv, count=d, part="encoder"),
                TowerLinear(name="self_attn.v_proj", in_features=h, out_features=kv, count=d, part="encoder"),
                TowerLinear(name="self_attn.o_proj", in_features=h, out_features=h, count=d, part="encoder",
                            bias=False),
                TowerLinear(name="mlp.gate_proj", in_features=h, out_features=i, count=d, part="encoder", bias=False),
                TowerLinear(name="mlp.up_proj", in_features=h, out_features=i, count=d, part="encoder", bias=False),
                TowerLinear(name="mlp.down_proj", in_features=i, out_features=h, count=d, part="encoder", bias=False),
                TowerLinear(name="multi_modal_projector", in_features=h, out_features=self.out_hidden_size, count=1,
                            part="merger"))

    def sam_layer_params(self, layer: int) -> int:
        """One SAM layer: its four linears, two LayerNorms, rel_pos_h / rel_pos_w over the grid or the window."""
        own = sum(x.params // x.count for x in self.linears() if x.part == "sam") + 4 * self.sam_hidden
        side = self.sam_grid if layer in self.global_layers else self.window_size
        return own + (2 * (2 * side - 1) * (self.sam_hidden // self.sam_heads) if self.use_rel_pos else 0)

    @property
    def sam_embed_params(self) -> int:
        h = self.sam_hidden
        return self.in_channels * self.patch_size ** 2 * h + h + (self.sam_grid ** 2 * h if self.use_abs_pos else 0)

    @property
    def sam_head_params(self) -> int:
        """The neck (conv1 1 × 1, conv2 3 × 3, no biases, two LayerNorms) and DeepseekOcr2SamVisionProj's two 3 × 3
        convolutions (no biases)."""
        c, (c1, c2) = self.sam_channels, self.downsample_channels
        return self.sam_hidden * c + 9 * c * c + 4 * c + 9 * c * c1 + 9 * c1 * c2

    @property
    def sam_params(self) -> int:
        return self.sam_embed_params + sum(self.sam_layer_params(k) for k in range(self.sam_depth)) + \
            self.sam_head_params

    @property
    def block_params(self) -> int:
        """One encoder layer: its seven linears and two RMSNorms."""
        return sum(x.params // x.count for x in self.linears() if x.part == "encoder") + 2 * self.hidden_size

    @property
    def queries_params(self) -> int:
        return (QUERIES_768 + QUERIES_1024) * self.hidden_size

    @property
    def tower_params(self) -> int:
        """SAM, the encoder's layers and final norm, the two query tables."""
        return self.sam_params + self.depth * self.block_params + self.hidden_size + self.queries_params

    @property
    def merger_params(self) -> int:
        """The projector Linear and view_separator."""
        return self.hidden_size * self.out_hidden_size + 2 * self.out_hidden_size

    @property
    def num_params(self) -> int:
        return self.tower_params + self.merger_params


def sub_config(raw: Any, key: str, name: str) -> dict[str, Any]:
    """A vision_config sub-config (sam_config, encoder_config) as a dict: {} when omitted, refused when not an
    object."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise SpecError(f"model {name}: vision_config.{key} must be an object, got {type(raw).__name__}")
    return raw


def deepseek_ocr2_tower_from_config(cfg: dict[str, Any], name: str) -> DeepseekOcr2TowerSpec:
    """The DeepseekOcr2TowerSpec of a deepseek_ocr2 config.json dict; keys it omits take the config classes'
    defaults."""
    raw = cfg.get("vision_config")
    if raw is not None and not isinstance(raw, dict):
        raise SpecError(f"model {name}: vision_config must be an object, got {type(raw).__name__}")
    sc = {**SAM_DEFAULTS, **sub_config((raw or {}).get("sam_config"), "sam_config", name)}
    ec = {**ENCODER_DEFAULTS, **sub_config((raw or {}).get("encoder_config"), "encoder_config", name)}
    for key in ("image_size", "patch_size"):
        if isinstance(sc[key], (list, tuple)):
            raise SpecError(f"model {name}: vision_config.sam_config.{key} {sc[key]!r}: hpcmem models square images "
                            "(an integer)")
    if not sc["use_abs_pos"] or not sc["use_rel_pos"]:
        raise SpecError(f"model {name}: vision_config.sam_config use_abs_pos/use_rel_pos false: hpcmem derives the "
                        "SAM attention with relative positions and the absolute table (the class defaults)")
    if ec["use_sliding_window"]:
        raise SpecError(f"model {name}: vision_config.encoder_config.use_sliding_window true: the encoder's sliding "
                        "layers are not modelled")
    # DeepseekOcr2SamVisionConfig.__post_init__: mlp_dim int(hidden_size · mlp_ratio) and [512, 896] when None
    mlp = sc["mlp_dim"] if sc["mlp_dim"] is not None else int(sc["hidden_size"] * sc["mlp_ratio"])
    ds = sc["downsample_channels"] if sc["downsample_channels"] is not None else [512, 896]
    if not isinstance(ds, (list, tuple)) or len(ds) != 2:
        raise SpecError(f"model {name}: vision_config.sam_config.downsample_channels {ds!r} must be two channel "
                        "counts")
    kv = ec["num_key_value_heads"] if ec["num_key_value_heads"] is not None else ec["num_attention_heads"]
    gl = tuple(int(x) for x in (sc["global_attn_indexes"] or ()) if 0 <= int(x) < sc["num_hidden_layers"])
    return DeepseekOcr2TowerSpec(
        model_type="deepseek_ocr2", depth=ec["num_hidden_layers"], hidden_size=ec["hidden_size"],
        intermediate_size=ec["intermediate_size"], num_heads=ec["num_attention_heads"], encoder_kv_heads=kv,
        in_channels=sc["num_channels"], patch_size=sc["patch_size"],
        out_hidden_size=text_width(cfg, TEXT_HIDDEN), hidden_act=str(ec["hidden_act"]),
        sam_depth=sc["num_hidden_layers"], sam_hidden=sc["hidden_size"], sam_mlp=mlp,
        sam_heads=sc["num_attention_heads"], sam_channels=sc["output_channels"],
        downsample_channels=(int(ds[0]), int(ds[1])), sam_image_size=sc["image_size"],
        window_size=sc["window_size"], global_layers=gl, sam_qkv_bias=bool(sc["qkv_bias"]),
        use_abs_pos=bool(sc["use_abs_pos"]), use_rel_pos=bool(sc["use_rel_pos"]))

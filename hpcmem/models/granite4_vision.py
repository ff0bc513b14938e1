"""Granite4VisionTowerSpec: Granite 4 Vision's SigLIP tower, its eight Window Q-Former projectors and LLaVA-NeXT's
anyres tiles with the Q-Former's downsampling (transformers 5.24 models/granite4_vision/modular_granite4_vision.py).

- The config (`Granite4VisionConfig(LlavaNextConfig)`): `vision_config` through AutoConfig (class default
  clip_vision_model; the released checkpoints name siglip_vision_model: ibm-granite/granite-4.0-3b-vision and
  granite-vision-4.1-4b, google/siglip2-so400m-patch16-384's tower — width 1152, MLP 4304, 16 heads, 384 px tiles of
  16 px patches, 27 layers), `qformer_config` a blip_2_qformer (`sub_configs_defaults` init_kwargs: 1 layer, MLP 3072,
  cross-attention every layer, no text input; `__post_init__` sets its width and encoder width to the tower's and its
  heads to width / 64), `downsample_rate` ("4/8" in the checkpoints: query window side / key window side; None by
  default, which `Granite4VisionWindowQFormerDownsampler.__init__` cannot split), `deepstack_layer_map` ([vision
  hidden-state index, text layer] pairs: [[-19, 9], [-13, 6], [-7, 3], [-1, 0]] in the checkpoints; None by default,
  which `Granite4VisionModel.__init__` cannot take the length of), `spatial_vision_layer` (-1) and
  `spatial_target_layers` ([12, 15, 18, 21]), `projector_dropout` 0.1, vision_feature_select_strategy ("full" in the
  checkpoints), image_grid_pinpoints (multiples of 384 in the checkpoints).
- The model (`Granite4VisionModel(LlavaNextModel)`): the tower, `image_newline` (one text-width vector), no
  multi_modal_projector (deleted), one `Granite4VisionWindowQFormerDownsampler` per deepstack pair
  (`layerwise_projectors`) and four more over the spatial layer (`spatial_projectors`, offsets TL, TR, BL, BR). Each:
  `norm` LayerNorm(width), `query` [1, q², width], `image_positions` [1, w², width], a Blip2QFormerModel (`layernorm`,
  per layer self-attention query/key/value/output.dense with biases and a LayerNorm, cross-attention the same over
  the tower's width, intermediate_query.dense → output_query.dense and a LayerNorm) and `out_linear` Linear(width →
  text width, bias).
- One tile's features (`Granite4VisionWindowQFormerDownsampler.forward`): its side × side patches (side = image_size /
  patch_size) cut into (side / w)² windows of w × w keys, each giving q × q queries: (side · q / w)² rows — the
  processor's `_get_number_of_features` with the patch grid scaled by `downsample_rate` (`token_side`).
- The text part is Granite's layers (`Granite4VisionTextModel(GraniteModel)`, a learned type) with the projectors'
  features added to the image tokens' rows before the decoder layer each pair names.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any, ClassVar

from hpcmem.errors import Problems, SpecError
from hpcmem.models.llava_next import DEFAULT_PINPOINTS, LlavaNextTowerSpec, pinpoints_from_config
from hpcmem.models.siglip import SIGLIP_ACTIVATIONS, SIGLIP_DEFAULTS, SiglipTowerCounts
from hpcmem.models.tower_base import TowerLinear, check_counts, encoder_layer_linears, text_width

# Granite4VisionTextConfig's field defaults (configuration_granite4_vision.py): its hidden_size, the text width when
# the text_config names none
TEXT_HIDDEN = 4096
# Granite4VisionConfig.sub_configs_defaults' qformer init_kwargs over Blip2QFormerConfig's defaults
# (configuration_blip_2.py: hidden_act gelu, layer_norm_eps 1e-12, dropouts 0.1)
QFORMER_DEFAULTS: dict[str, Any] = {"num_hidden_layers": 1, "intermediate_size": 3072, "cross_attention_frequency": 1,
                                    "use_qformer_text_input": False, "hidden_act": "gelu",
                                    "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1}
# Granite4VisionConfig's own defaults (and LlavaNextConfig's it reads)
OUTER_DEFAULTS: dict[str, Any] = {"vision_feature_select_strategy": "default", "downsample_rate": None,
                                  "deepstack_layer_map": None, "spatial_vision_layer": -1,
                                  "spatial_target_layers": [12, 15, 18, 21], "projector_dropout": 0.1}
SPATIAL_GROUPS = 4      # Granite4VisionModel.__init__: spatial_projectors, offsets 0..3
Q_HEAD = 64             # Granite4VisionConfig.__post_init__: qformer heads = width // 64


@dataclass(frozen=True, kw_only=True)
class Granite4VisionTowerSpec(SiglipTowerCounts, LlavaNextTowerSpec):
    """A SigLIP tower, `image_newline`, and one Window Q-Former projector per deepstack pair and per spatial group,
    over LLaVA-NeXT's anyres tiles."""

    query_side: int                     # downsample_rate's numerator: q × q queries a window
    window_side: int                    # its denominator: w × w keys a window
    deepstack: tuple[tuple[int, int], ...]      # (vision hidden-state index, text layer) per layerwise projector
    spatial_layer: int                  # spatial_vision_layer
    spatial_targets: tuple[int, ...]    # spatial_target_layers, one per spatial projector
    text_layers: int                    # the text config's num_hidden_layers
    q_layers: int                       # qformer_config.num_hidden_layers
    q_intermediate: int                 # qformer_config.intermediate_size
    projector_dropout: float
    q_dropout: float                    # qformer hidden_dropout_prob
    q_attention_dropout: float          # qformer attention_probs_dropout_prob
    family: str = "granite4_vision"
    activations: ClassVar[tuple[str, ...]] = SIGLIP_ACTIVATIONS
    whole_grid: ClassVar[bool] = True

    def __post_init__(self) -> None:
        super().__post_init__()
        p = Problems()
        check_counts(p, self, ("query_side", "window_side", "q_layers", "q_intermediate"), prefix="")
        p.raise_if_any()
        side = self.image_size // self.patch_size
        p.check(side % self.window_side == 0,
                f"downsample_rate {self.query_side}/{self.window_side}: the tile's {side} patches a side are not a "
                "whole number of key windows (Granite4VisionWindowQFormerDownsampler._windowed_raster)")
        p.check(self.query_side <= self.window_side,
                f"downsample_rate {self.query_side}/{self.window_side}: hpcmem models downsampling (q ≤ w)")
        p.check(self.hidden_size % Q_HEAD == 0,
                f"vision_config.hidden_size {self.hidden_size}: the Q-Former's heads are width // {Q_HEAD}, which "
                "must divide the width")
        p.check(side % 2 == 0, f"the tile's {side} patches a side: spatial_offset_downsample takes 2 × 2 blocks")
        p.check(self.query_side * 2 == self.window_side,
                f"downsample_rate {self.query_side}/{self.window_side}: the spatial projectors sample every 2 × 2 "
                "block (side / 2 a side), which the query windows must tile: hpcmem models a rate of 1/2")
        p.check(len(self.deepstack) > 0, "deepstack_layer_map: hpcmem models at least one layerwise projector")
        taps = (*(x for x, _ in self.deepstack), self.spatial_layer)
        p.check(all(-self.depth - 1 <= x <= self.depth for x in taps),
                f"deepstack_layer_map / spatial_vision_layer {list(taps)}: not hidden states of the tower's "
                f"{self.depth} layers")
        p.check(all(x != 0 and x != -self.depth - 1 for x in taps),
                f"deepstack_layer_map / spatial_vision_layer {list(taps)}: hpcmem models taps of layer outputs, not "
                "the embeddings")
        targets = self.targets
        p.check(len(set(targets)) == len(targets) and all(0 <= t < self.text_layers for t in targets),
                f"deepstack_layer_map / spatial_target_layers {list(targets)}: hpcmem models distinct text layers of "
                f"the {self.text_layers}, each projector's features added once (a repeated or missing layer leaves "
                "a projector's output unread)")
        p.raise_if_any()

    @property
    def targets(self) -> tuple[int, ...]:
        """The text layer each projector's features are added before: the deepstack pairs', then the spatial groups'."""
        return (*(t for _, t in self.deepstack), *self.spatial_targets)

    @property
    def projectors(self) -> int:
        return len(self.deepstack) + SPATIAL_GROUPS

    @property
    def side(self) -> int:
        return self.image_size // self.patch_size

    @property
    def windows(self) -> int:
        """Key windows of one tile ((side / w)²), each one Q-Former batch row."""
        return (self.side // self.window_side) ** 2

    @property
    def token_side(self) -> int:
        """Image-token rows a side of one tile: side · q / w (processing_granite4_vision.py `_get_number_of_features`:
        `int(patches_height * Fraction(downsample_rate))`)."""
        return int(self.side * Fraction(self.query_side, self.window_side))

    @property
    def tokens_per_tile(self) -> int:
        return self.token_side ** 2

    def unpadded_grid(self, height: int, width: int) -> tuple[int, int]:
        """LLaVA-NeXT's unpadded grid over the downsampled token grid (`_get_unpadded_features` with patches_height
        scaled; modular_granite4_vision.py `pack_image_features` likewise)."""
        ph, pw = self.best_resolution(height, width)
        rows, cols = self.token_side * (ph // self.image_size), self.token_side * (pw // self.image_size)
        if width / height > cols / rows:
            kept = int(round(height * (cols / width), 7))
            rows -= (rows - kept) // 2 * 2
        else:
            kept = int(round(width * (rows / height), 7))
            cols -= (cols - kept) // 2 * 2
        return rows, cols

    def anyres_tokens(self, height: int, width: int) -> int:
        """Image tokens of one image: the unpadded grid, a newline per row, the base tile's tokens ("full")."""
        rows, cols = self.unpadded_grid(height, width)
        return rows * cols + rows + self.tokens_per_tile

    def linears(self) -> tuple[TowerLinear, ...]:
        """The tower's linears, then each projector's: the Q-Former's (self-attention, cross-attention over the
        tower's width, the query MLP), `out_linear`."""
        h, i, o, k, n = self.hidden_size, self.q_intermediate, self.out_hidden_size, self.q_layers, self.projectors
        q = "qformer.encoder.layer.N."
        attn = tuple(TowerLinear(name=f"{q}{a}.{x}", in_features=h, out_features=h, count=n * k, part="merger")
                     for a in ("attention", "crossattention")
                     for x in ("attention.query", "attention.key", "attention.value", "output.dense"))
        return (*encoder_layer_linears(self.hidden_size, self.intermediate_size, self.depth), *attn,
                TowerLinear(name=f"{q}intermediate_query.dense", in_features=h, out_features=i, count=n * k,
                            part="merger"),
                TowerLinear(name=f"{q}output_query.dense", in_features=i, out_features=h, count=n * k,
                            part="merger"),
                TowerLinear(name="out_linear", in_features=h, out_features=o, count=n, part="merger"))

    @property
    def projector_params(self) -> int:
        """One projector: its linears, `norm`, `query`, `image_positions`, the Q-Former's `layernorm` and three
        LayerNorms a layer."""
        h = self.hidden_size
        linear = sum(x.params for x in self.linears() if x.part == "merger") // self.projectors
        return linear + 2 * h + (self.query_side ** 2 + self.window_side ** 2) * h + 2 * h + 3 * 2 * h * self.q_layers

    @property
    def merger_params(self) -> int:
        """The eight (or len(deepstack) + 4) projectors."""
        return self.projectors * self.projector_params

    @property
    def trained_layers(self) -> int:
        """Tower layers on the loss's path: up to the deepest tap (hidden_states[k] is layer k's output)."""
        taps = (*(x for x, _ in self.deepstack), self.spatial_layer)
        return max(x if x > 0 else self.depth + 1 + x for x in taps)

    @property
    def unused_params(self) -> int:
        """Off the loss's path: the layers past the deepest tap and post_layernorm (its output, last_hidden_state,
        is never read)."""
        return (self.depth - self.trained_layers) * self.block_params + self.post_norm_params


def _pairs(raw: Any, name: str) -> tuple[tuple[int, int], ...]:
    ok = isinstance(raw, (list, tuple)) and all(
        isinstance(p, (list, tuple)) and len(p) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in p)
        for p in raw)
    if not ok:
        raise SpecError(f"model {name}: deepstack_layer_map {raw!r} must be a list of [vision_layer, text_layer] "
                        "integer pairs (Granite4VisionModel.__init__ builds one projector per pair; None fails there)")
    return tuple((int(a), int(b)) for a, b in raw)


def granite4_vision_tower_from_config(cfg: dict[str, Any], name: str) -> Granite4VisionTowerSpec:
    """The Granite4VisionTowerSpec of a granite4_vision config.json dict; keys it omits take the config classes'
    defaults, and the settings those defaults cannot build a model with are refused in one line."""
    raw = cfg.get("vision_config")
    if not isinstance(raw, dict) or raw.get("model_type") != "siglip_vision_model":
        got = raw.get("model_type") if isinstance(raw, dict) else raw
        raise SpecError(f"model {name}: granite4_vision's vision_config.model_type {got!r}: hpcmem models the "
                        "released checkpoints' SigLIP tower (siglip_vision_model); the class default CLIP tower "
                        "(clip_vision_model) is not modelled")
    vc = {**SIGLIP_DEFAULTS, **raw}
    for key in ("image_size", "patch_size"):
        if isinstance(vc[key], (list, tuple)):
            raise SpecError(f"model {name}: vision_config.{key} {vc[key]!r}: hpcmem models square images (an integer)")
    if vc.get("vision_use_head"):
        raise SpecError(f"model {name}: vision_config.vision_use_head true: SiglipVisionModel runs its attention-"
                        "pooling head on every tile, which hpcmem does not model for granite4_vision (set it false)")
    outer = {**OUTER_DEFAULTS, **{k: cfg[k] for k in OUTER_DEFAULTS if k in cfg}}
    if outer["vision_feature_select_strategy"] != "full":
        # get_image_features drops each tile's first row under "default": a SigLIP tile then has side² - 1 rows, which
        # Granite4VisionWindowQFormerDownsampler.forward refuses (a ValueError)
        raise SpecError(f"model {name}: vision_feature_select_strategy "
                        f"{outer['vision_feature_select_strategy']!r}: a SigLIP tower has no class token to drop; "
                        "hpcmem models granite4_vision with 'full' (the released checkpoints')")
    rate = outer["downsample_rate"]
    parts = str(rate).split("/") if isinstance(rate, str) else []
    if len(parts) != 2 or not all(x.strip().isdigit() and int(x) > 0 for x in parts):
        raise SpecError(f"model {name}: downsample_rate {rate!r} must be 'q/w' with positive integers (the released "
                        "checkpoints' '4/8'; Granite4VisionWindowQFormerDownsampler splits it on '/')")
    deep = _pairs(outer["deepstack_layer_map"], name)
    targets = outer["spatial_target_layers"]
    if not (isinstance(targets, (list, tuple)) and len(targets) == SPATIAL_GROUPS
            and all(isinstance(x, int) and not isinstance(x, bool) for x in targets)):
        raise SpecError(f"model {name}: spatial_target_layers {targets!r} must be {SPATIAL_GROUPS} integers (one per "
                        "spatial offset group)")
    spatial = outer["spatial_vision_layer"]
    if not isinstance(spatial, int) or isinstance(spatial, bool):
        raise SpecError(f"model {name}: spatial_vision_layer {spatial!r} must be an integer")
    dropout = outer["projector_dropout"]
    if not isinstance(dropout, (int, float)) or isinstance(dropout, bool) or not 0 <= dropout < 1:
        raise SpecError(f"model {name}: projector_dropout {dropout!r} must be a number in [0, 1)")
    qraw = cfg.get("qformer_config") or {}
    if not isinstance(qraw, dict):
        raise SpecError(f"model {name}: qformer_config must be an object, got {type(qraw).__name__}")
    qc = {**QFORMER_DEFAULTS, **qraw}
    if qc["use_qformer_text_input"] or qc["cross_attention_frequency"] != 1 or qc["hidden_act"] != "gelu":
        raise SpecError(f"model {name}: qformer_config use_qformer_text_input {qc['use_qformer_text_input']!r}, "
                        f"cross_attention_frequency {qc['cross_attention_frequency']!r}, hidden_act "
                        f"{qc['hidden_act']!r}: hpcmem models the class's (false, 1, gelu)")
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {}
    spec = Granite4VisionTowerSpec(
        model_type="granite4_vision", depth=vc["num_hidden_layers"], hidden_size=vc["hidden_size"],
        intermediate_size=vc["intermediate_size"], num_heads=vc["num_attention_heads"], in_channels=vc["num_channels"],
        image_size=vc["image_size"], patch_size=vc["patch_size"], out_hidden_size=text_width(cfg, TEXT_HIDDEN),
        hidden_act=str(vc["hidden_act"]), projector_act="gelu", projector_bias=True, feature_layer=-1,
        drop_class_token=False, fixed_resolution=False, query_side=int(parts[0]), window_side=int(parts[1]),
        deepstack=deep, spatial_layer=spatial, spatial_targets=tuple(targets),
        text_layers=int(text.get("num_hidden_layers", 32)), q_layers=qc["num_hidden_layers"],
        q_intermediate=qc["intermediate_size"], projector_dropout=float(dropout),
        q_dropout=float(qc["hidden_dropout_prob"]), q_attention_dropout=float(qc["attention_probs_dropout_prob"]))
    return replace(spec, grid_pinpoints=pinpoints_from_config(cfg, name, spec.image_size, DEFAULT_PINPOINTS))

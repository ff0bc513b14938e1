"""MllamaTowerSpec: the vision model, projector and cross-attention extras of Llama-3.2-Vision (model_type "mllama"),
as its config.json's `vision_config` and `text_config` describe them, their parameter count and the image
processor's tiling (transformers 5.24 models/mllama).

- The tower (modeling_mllama.py `MllamaVisionModel`): a Conv2d patch embedding without bias (kernel = stride =
  patch_size), a class embedding, `gated_positional_embedding` (`MllamaPrecomputedPositionEmbedding`: a gate, a
  position table of (image_size / patch_size)² + 1 rows, and a tile table of max_aspect_ratio_id + 1 rows of
  max_num_tiles · rows · hidden_size), `pre_tile_positional_embedding` and `post_tile_positional_embedding`
  (`MllamaPrecomputedAspectRatioEmbedding`: max_aspect_ratio_id + 1 rows of max_num_tiles · hidden_size and a gate),
  `layernorm_pre`, `layernorm_post`, the local encoder (`transformer`, num_hidden_layers `MllamaVisionEncoderLayer`s:
  LayerNorm → q/k/v/o_proj without bias → LayerNorm → fc1 → gelu → fc2 with biases) and the gated global encoder
  (`global_transformer`, num_global_layers of the same layers, each with gate_attn and gate_ffn). max_aspect_ratio_id
  is len(supported_aspect_ratios) (configuration_mllama.py `MllamaVisionConfig.max_aspect_ratio_id`).
- The projector (`MllamaModel.multi_modal_projector`): nn.Linear(vision_output_dim → text hidden_size) with bias,
  over the concatenation of the global encoder's output and the local encoder's `intermediate_layers_indices` outputs.
- The text model (`MllamaTextModel`) is a Llama decoder of num_hidden_layers layers, of which those in
  `cross_attention_layers` are `MllamaCrossAttentionDecoderLayer`s: the same q/k/v/o_proj shapes, MLP and two
  RMSNorms as a self-attention layer, plus q_norm and k_norm over the head dim (`MllamaTextCrossAttention`) and two
  scalar gates (cross_attn_attn_gate, cross_attn_mlp_gate); `embed_tokens` has vocab_size + 8 rows. `text_extra_params`
  is what the real text model has beyond a Llama of the same config (hpcmem.models.config's llama family).
- The image processor (image_processing_pil_mllama.py `MllamaImageProcessorPil.resize`, `get_optimal_tiled_canvas`):
  an image becomes rows × cols tiles of size.height px (rows · cols ≤ max_image_tiles), but `pack_images` pads every
  image to max_image_tiles tiles, so the tower always runs max_image_tiles tiles per image; the number of real tiles
  only sets `aspect_ratio_mask` and the cross-attention mask's values (`mllama_tiles`). The tower's rows per tile are
  (image_size / patch_size)² + 1, padded to a multiple of 8 (`MllamaVisionModel.forward`, `num_padding_patches`);
  the cross-attention layers' keys and values run over images × max_num_tiles × ((image_size / patch_size)² + 1)
  rows (the padding sliced off). The language model's sequence holds one <|image|> token per image
  (processing_mllama.py: the image token is not expanded).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpcmem.errors import Problems, SpecError
from hpcmem.models.tower_base import (LinearTower, TowerLinear, check_activation, check_counts, check_heads,
                                      encoder_layer_linears, grid_patches)

# MllamaVisionConfig's class defaults (configuration_mllama.py); MllamaTextConfig's that the extras read
MLLAMA_VISION_DEFAULTS: dict[str, Any] = {
    "hidden_size": 1280, "hidden_act": "gelu", "num_hidden_layers": 32, "num_global_layers": 8, "attention_heads": 16,
    "num_channels": 3, "intermediate_size": 5120, "vision_output_dim": 7680, "image_size": 448, "patch_size": 14,
    "max_num_tiles": 4, "intermediate_layers_indices": [3, 7, 15, 23, 30],
    "supported_aspect_ratios": [[1, 1], [1, 2], [1, 3], [1, 4], [2, 1], [2, 2], [3, 1], [4, 1]]}
MLLAMA_TEXT_DEFAULTS: dict[str, Any] = {"hidden_size": 4096, "num_attention_heads": 32,
                                        "cross_attention_layers": [3, 8, 13, 18, 23, 28, 33, 38]}
# the activations whose saved tensors hpcmem.estimate derives for the tower's fc1 → act → fc2 MLP
ACTIVATIONS = ("gelu", "gelu_pytorch_tanh", "quick_gelu")
EXTRA_EMBED_ROWS = 8        # MllamaTextModel.embed_tokens: nn.Embedding(vocab_size + 8, hidden_size)
PAD_MULTIPLE = 8            # MllamaVisionModel.forward pads each tile's rows to a multiple of 8


@dataclass(frozen=True, kw_only=True)
class MllamaTowerSpec(LinearTower):
    """Llama-3.2-Vision's vision model and projector; `depth` is the local encoder's layers (num_hidden_layers),
    `out_hidden_size` the text width, `text_heads` the text model's attention heads, `cross_layers` its
    cross-attention layers' indices."""

    global_depth: int           # num_global_layers
    image_size: int
    max_num_tiles: int
    aspect_ratios: int          # len(supported_aspect_ratios), max_aspect_ratio_id
    intermediate_layers: tuple[int, ...]
    vision_output_dim: int
    text_heads: int
    cross_layers: tuple[int, ...]
    # what the shared vision code reads of a tower (hpcmem.models.vision_spec.VisionSpec's names)
    norm: str = "layer"
    mlp: str = "fc"
    deepstack_visual_indexes: tuple[int, ...] = ()
    deepstack_params: int = 0
    hooked_input: bool = True       # MllamaVisionModel.get_input_embeddings returns its patch embedding
    family: str = "mllama"

    def __post_init__(self) -> None:
        p = Problems()
        check_counts(p, self, ("depth", "global_depth", "hidden_size", "intermediate_size", "num_heads",
                               "in_channels", "image_size", "patch_size", "max_num_tiles", "aspect_ratios",
                               "vision_output_dim", "out_hidden_size", "text_heads"), prefix="")
        check_activation(p, self.hidden_act, ACTIVATIONS)
        p.raise_if_any()
        check_heads(p, self.hidden_size, self.num_heads, "attention_heads")
        p.check(all(0 <= i < self.depth for i in self.intermediate_layers),
                f"vision_config.intermediate_layers_indices {list(self.intermediate_layers)} must lie in "
                f"0..{self.depth - 1}")
        width = self.hidden_size * (1 + len(self.intermediate_layers))
        p.check(self.vision_output_dim == width,
                f"vision_config.vision_output_dim {self.vision_output_dim} must be hidden_size {self.hidden_size} × "
                f"(1 + {len(self.intermediate_layers)} intermediate_layers_indices) = {width}: "
                "MllamaVisionModel.forward concatenates those outputs before multi_modal_projector")
        p.check(self.out_hidden_size % self.text_heads == 0,
                f"text_config.hidden_size {self.out_hidden_size} is not a multiple of num_attention_heads "
                f"{self.text_heads}")
        p.raise_if_any()

    @property
    def patches(self) -> int:
        """Rows per tile: (image_size / patch_size)² patches and the class token (MllamaVisionModel.num_patches)."""
        return grid_patches(self.image_size, self.patch_size) + 1

    @property
    def padded_patches(self) -> int:
        """Rows per tile in the encoders: `patches` padded to a multiple of 8."""
        return -(-self.patches // PAD_MULTIPLE) * PAD_MULTIPLE

    def linears(self) -> tuple[TowerLinear, ...]:
        h, i, layers = self.hidden_size, self.intermediate_size, self.encoder_layers
        return (*encoder_layer_linears(h, i, layers, out_proj="o_proj", attention_bias=False),
                TowerLinear(name="multi_modal_projector", in_features=self.vision_output_dim,
                            out_features=self.out_hidden_size, count=1, part="merger"))

    @property
    def embed_params(self) -> int:
        """Patch embedding, class embedding, the gated position and tile-position tables, the pre- and post-tile
        aspect-ratio tables with their gates."""
        h, rows = self.hidden_size, self.aspect_ratios + 1
        position = 1 + self.patches * h + rows * self.max_num_tiles * self.patches * h
        aspect = 2 * (rows * self.max_num_tiles * h + 1)
        return self.patch_dim * h + h + position + aspect

    @property
    def encoder_layers(self) -> int:
        """The local and the global layers (block_params is a local one's; a global one has two gates more)."""
        return self.depth + self.global_depth

    @property
    def tower_params(self) -> int:
        """MllamaVisionModel: embeddings, layernorm_pre and layernorm_post, the local and the gated global layers."""
        return (self.embed_params + 2 * 2 * self.hidden_size
                + (self.depth + self.global_depth) * self.block_params + 2 * self.global_depth)

    @property
    def text_extra_params(self) -> int:
        """Beyond a Llama decoder of the text config: embed_tokens' 8 extra rows, and per cross-attention layer
        q_norm and k_norm (head_dim each) and the two gates."""
        head_dim = self.out_hidden_size // self.text_heads
        return EXTRA_EMBED_ROWS * self.out_hidden_size + len(self.cross_layers) * (2 * head_dim + 2)

    @property
    def num_params(self) -> int:
        return self.tower_params + self.merger_params + self.text_extra_params


def mllama_tiles(height: int, width: int, tile: int, max_tiles: int) -> tuple[int, int]:
    """(rows, cols) of tiles one height × width image becomes (image_processing_pil_mllama.py
    `get_optimal_tiled_canvas`): of the canvases rows · tile × cols · tile with rows · cols ≤ max_tiles
    (`get_all_supported_aspect_ratios`), each scaled by min(canvas_h / height, canvas_w / width); the smallest scale
    ≥ 1 when any canvas upscales, else the largest; ties to the smallest canvas area, then the first listed
    (`get_all_supported_aspect_ratios` lists pairs with the first varying slowest, and the canvas reads the first of
    each pair as its height)."""
    if height < 1 or width < 1:
        raise SpecError(f"image {height}×{width} px: both sides must be ≥ 1")
    grids = [(h, w) for h in range(1, max_tiles + 1) for w in range(1, max_tiles + 1) if h * w <= max_tiles]
    scales = [min(h * tile / height, w * tile / width) for h, w in grids]
    up = [s for s in scales if s >= 1]
    chosen = min(up) if up else max(scales)
    return min((g for g, s in zip(grids, scales, strict=True) if s == chosen), key=lambda g: g[0] * g[1])


def mllama_tower_from_config(cfg: dict[str, Any], name: str) -> MllamaTowerSpec:
    """The MllamaTowerSpec of an mllama config.json dict; keys it omits take MllamaVisionConfig's and
    MllamaTextConfig's class defaults."""
    raw, text = cfg.get("vision_config") or {}, cfg.get("text_config") or {}
    for key, part in (("vision_config", raw), ("text_config", text)):
        if not isinstance(part, dict):
            raise SpecError(f"model {name}: {key} must be an object, got {type(part).__name__}")
    vc = {**MLLAMA_VISION_DEFAULTS, **raw}
    if "num_attention_heads" in raw and "attention_heads" not in raw:        # MllamaVisionConfig.attribute_map
        vc["attention_heads"] = raw["num_attention_heads"]
    tc = {**MLLAMA_TEXT_DEFAULTS, **text}
    for key in ("image_size", "patch_size"):
        if isinstance(vc[key], (list, tuple)):
            raise SpecError(f"model {name}: vision_config.{key} {vc[key]!r}: hpcmem models square tiles (an integer)")
    for key, value in (("vision_config.intermediate_layers_indices", vc["intermediate_layers_indices"]),
                       ("text_config.cross_attention_layers", tc["cross_attention_layers"])):
        if not isinstance(value, (list, tuple)) or not all(isinstance(x, int) for x in value):
            raise SpecError(f"model {name}: {key} must be a list of integers, got {value!r}")
    ratios = vc["supported_aspect_ratios"]
    if not isinstance(ratios, (list, tuple)) or not ratios:
        raise SpecError(f"model {name}: vision_config.supported_aspect_ratios must be a non-empty list, got {ratios!r}")
    return MllamaTowerSpec(model_type=str(cfg["model_type"]), depth=vc["num_hidden_layers"],
                           global_depth=vc["num_global_layers"], hidden_size=vc["hidden_size"],
                           intermediate_size=vc["intermediate_size"], num_heads=vc["attention_heads"],
                           in_channels=vc["num_channels"], image_size=vc["image_size"], patch_size=vc["patch_size"],
                           max_num_tiles=vc["max_num_tiles"], aspect_ratios=len(ratios),
                           intermediate_layers=tuple(vc["intermediate_layers_indices"]),
                           vision_output_dim=vc["vision_output_dim"], out_hidden_size=tc["hidden_size"],
                           text_heads=tc["num_attention_heads"], cross_layers=tuple(tc["cross_attention_layers"]),
                           hidden_act=str(vc["hidden_act"]))

"""Ovis2TowerSpec: Ovis2's (model_type "ovis2") vision tower, its visual-tokenizer head and the visual embedding table,
as its config.json's `vision_config` and outer keys describe them, their linear layers, parameter count and image
tokens (transformers 5.24).

- The config (models/ovis2/configuration_ovis2.py): an omitted `vision_config` is Ovis2VisionConfig's class defaults
  (`OVIS2_VISION_DEFAULTS`), an omitted `text_config` a bare `qwen2` one. The outer `hidden_size` (1536) and
  `vocab_size` (151643) are Ovis2Config's own: `Ovis2Model.visual_embeddings_table` is vision vocab_size × the outer
  hidden_size and `Ovis2ForConditionalGeneration.lm_head` the outer hidden_size → the outer vocab_size, tied to
  the text model's embed_tokens (`_tied_weights_keys`, `tie_word_embeddings` True).
- The tower (modeling_ovis2.py `Ovis2VisionModel.transformer`, `Ovis2VisionTransformer`): `Ovis2VisionEmbeddings`
  (a Conv2d patch embedding with bias, RMSNorm, a position table of (image_size / patch_size)² rows), then
  `num_hidden_layers` `Ovis2VisionEncoderLayer`s (rms_norm1 → attention q/k/v/out_proj, biases when `qkv_bias`;
  rms_norm2 → `Ovis2MLP` gate/up/down_proj, biases when `mlp_bias`, act(gate) × up), and a last RMSNorm.
- The visual tokenizer (`Ovis2VisionModel.forward`): with `hidden_stride` s > 1 the g × g patch grid is zero-padded
  to a multiple of s and every s × s block concatenated (g' = ⌈g / s⌉, g'² rows of s²·hidden); `head_linear`
  (s²·hidden → vocab_size − num_visual_indicator_tokens, no bias), `head_norm` (LayerNorm over that width), softmax
  (`tokenize_function` "softmax"; "st_argmax" and "gumbel_argmax" add a hard one-hot).
- The embedding (`Ovis2Model.get_image_features`): the probabilities padded with num_visual_indicator_tokens zero
  columns to vocab_size, then `Ovis2VisualEmbeddingTable.forward`'s matmul with the table: one text-width row per
  image token; the indicator rows are the table's last num_visual_indicator_tokens rows, written over the embeddings
  of `visual_indicator_token_ids` in `Ovis2Model.forward`.
- The processor (processing_ovis2.py `Ovis2Processor.replace_image_token`): <IMG_START>, image_seq_length
  <IMG_ATOM> (the image token), <IMG_GRID>, then for a grid of more than one tile each tile's image_seq_length atoms
  with <IMG_COL> between columns and <IMG_ROW> between rows, and <IMG_END>. Its image processor
  (image_processing_ovis2.py, `crop_to_patches` False by default) resizes every image to `size`: one tile, one
  resolution; `get_placeholder_mask` raises unless image_seq_length equals g'².
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpcmem.errors import Problems, SpecError
from hpcmem.models.tower_base import (LinearTower, TowerLinear, check_activation, check_counts, check_heads,
                                      check_whole_grid, grid_patches, text_width, vision_values)

# Ovis2VisionConfig's class defaults (models/ovis2/configuration_ovis2.py)
OVIS2_VISION_DEFAULTS: dict[str, Any] = {"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 24,
                                         "num_attention_heads": 8, "num_channels": 3, "image_size": 224,
                                         "patch_size": 14, "qkv_bias": False, "mlp_bias": False, "hidden_act": "silu",
                                         "vocab_size": 16384, "hidden_stride": 1, "num_visual_indicator_tokens": 5,
                                         "tokenize_function": "softmax"}
OVIS2_HIDDEN = 1536             # Ovis2Config.hidden_size: the visual embedding table's and lm_head's width
OVIS2_VOCAB = 151643            # Ovis2Config.vocab_size: lm_head's rows
QWEN2_HIDDEN, QWEN2_VOCAB = 4096, 151936    # Qwen2Config's: an omitted text_config's width and vocabulary
TOKENIZE_FUNCTIONS = ("softmax", "st_argmax", "gumbel_argmax")


@dataclass(frozen=True, kw_only=True)
class Ovis2TowerSpec(LinearTower):
    """An Ovis2 tower (RMSNorm, SwiGLU MLP; Ovis2VisionTransformer) and, as its "merger", the visual tokenizer
    (head_linear, head_norm, softmax) and the visual embedding table (vocab_size × out_hidden_size, the outer
    hidden_size)."""

    image_size: int
    hidden_stride: int
    visual_vocab_size: int
    indicator_tokens: int
    qkv_bias: bool = False
    mlp_bias: bool = False
    tokenize_function: str = "softmax"
    # what the shared vision code reads of a tower (hpcmem.models.vision_spec.VisionSpec's names): Ovis2VisionModel names
    # no input embeddings (get_input_embeddings raises NotImplementedError), so `enable_input_require_grads` hooks
    # the token embeddings alone
    norm: str = "rms"
    mlp: str = "gated"
    deepstack_visual_indexes: tuple[int, ...] = ()
    deepstack_params: int = 0
    hooked_input: bool = False
    fixed_resolution: bool = True
    family: str = "ovis2"

    def __post_init__(self) -> None:
        p = Problems()
        check_counts(p, self, ("depth", "hidden_size", "intermediate_size", "num_heads", "in_channels", "image_size",
                               "patch_size", "out_hidden_size", "hidden_stride", "visual_vocab_size"))
        check_heads(p, self.hidden_size, self.num_heads, "num_attention_heads")
        check_activation(p, self.hidden_act, ("silu",))
        check_whole_grid(p, self.image_size, self.patch_size)
        p.check(0 <= self.indicator_tokens < self.visual_vocab_size,
                f"vision_config.num_visual_indicator_tokens {self.indicator_tokens} must lie in [0, vocab_size)")
        p.check(self.tokenize_function in TOKENIZE_FUNCTIONS,
                f"vision_config.tokenize_function {self.tokenize_function!r} is none of {TOKENIZE_FUNCTIONS}")
        p.raise_if_any()

    @property
    def head_width(self) -> int:
        """head_linear's output width: the visual vocabulary less the indicator tokens."""
        return self.visual_vocab_size - self.indicator_tokens

    @property
    def patches(self) -> int:
        """The tower's rows per image: (image_size / patch_size)²."""
        return grid_patches(self.image_size, self.patch_size)

    @property
    def tokens_per_image(self) -> int:
        """Image tokens per tile: ⌈g / hidden_stride⌉² (the grid zero-padded to a multiple of the stride)."""
        side = -(-(self.image_size // self.patch_size) // self.hidden_stride)
        return side * side

    def linears(self) -> tuple[TowerLinear, ...]:
        h, i, d, s = self.hidden_size, self.intermediate_size, self.depth, self.hidden_stride
        attn = tuple(TowerLinear(name=f"attention.{n}", in_features=h, out_features=h, count=d, part="tower",
                                 bias=self.qkv_bias) for n in ("q_proj", "k_proj", "v_proj", "out_proj"))
        mlp = (*(TowerLinear(name=f"ffn.{n}", in_features=h, out_features=i, count=d, part="tower",
                             bias=self.mlp_bias) for n in ("gate_proj", "up_proj")),
               TowerLinear(name="ffn.down_proj", in_features=i, out_features=h, count=d, part="tower",
                           bias=self.mlp_bias))
        head = TowerLinear(name="head_linear", in_features=h * s * s, out_features=self.head_width, count=1,
                           part="merger", bias=False)
        return (*attn, *mlp, head)

    @property
    def block_params(self) -> int:
        """One encoder layer: its seven linears and two RMSNorms (weight only)."""
        return sum(x.params for x in self.linears() if x.part == "tower") // self.depth + 2 * self.hidden_size

    @property
    def embed_params(self) -> int:
        """Ovis2VisionEmbeddings: the Conv2d (weight and bias), its RMSNorm and the position table."""
        h = self.hidden_size
        return self.patch_dim * h + h + h + self.patches * h

    @property
    def tower_params(self) -> int:
        """Ovis2VisionTransformer: the embeddings, the layers and the last RMSNorm."""
        return self.embed_params + self.depth * self.block_params + self.hidden_size

    @property
    def merger_params(self) -> int:
        """The visual tokenizer and the table: head_linear, head_norm (LayerNorm weight and bias) and the visual
        embedding table (vocab_size rows of the outer hidden_size)."""
        head = sum(x.params for x in self.linears() if x.part == "merger")
        return head + 2 * self.head_width + self.visual_vocab_size * self.out_hidden_size


def ovis2_tower_from_config(cfg: dict[str, Any], name: str) -> Ovis2TowerSpec:
    """The Ovis2TowerSpec of an ovis2 config.json dict; keys it omits take Ovis2VisionConfig's defaults."""
    vc = vision_values(cfg, name, OVIS2_VISION_DEFAULTS)
    for key in ("image_size", "patch_size"):
        if isinstance(vc[key], (list, tuple)):
            raise SpecError(f"model {name}: vision_config.{key} {vc[key]!r}: hpcmem models square images (an integer)")
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {}
    width, vocab = cfg.get("hidden_size", OVIS2_HIDDEN), cfg.get("vocab_size", OVIS2_VOCAB)
    inner = (text_width(cfg, QWEN2_HIDDEN), text.get("vocab_size", QWEN2_VOCAB))
    if (width, vocab) != inner:
        raise SpecError(f"model {name}: ovis2's hidden_size {width!r} and vocab_size {vocab!r} must equal text_config's "
                        f"{inner!r}: the table's rows are scattered into the token embeddings and lm_head (outer "
                        "widths) is tied to embed_tokens")
    return Ovis2TowerSpec(model_type="ovis2", depth=vc["num_hidden_layers"], hidden_size=vc["hidden_size"],
                          intermediate_size=vc["intermediate_size"], num_heads=vc["num_attention_heads"],
                          in_channels=vc["num_channels"], image_size=vc["image_size"], patch_size=vc["patch_size"],
                          out_hidden_size=width, hidden_act=str(vc["hidden_act"]),
                          hidden_stride=vc["hidden_stride"], visual_vocab_size=vc["vocab_size"],
                          indicator_tokens=vc["num_visual_indicator_tokens"], qkv_bias=bool(vc["qkv_bias"]),
                          mlp_bias=bool(vc["mlp_bias"]), tokenize_function=str(vc["tokenize_function"]))

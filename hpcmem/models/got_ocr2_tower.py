"""GotOcr2TowerSpec: the GOT-OCR 2.0 tower of PP-Chart2Table (model_type "pp_chart2table", built by transformers as
`GotOcr2ForConditionalGeneration`, models/auto/modeling_auto.py) and its convolution projector, as its config.json's
`vision_config` and outer keys describe them, their linears and parameter count (transformers 5.24
models/got_ocr2/modeling_got_ocr2.py, models/pp_chart2table/).

What the model is (modeling_got_ocr2.py):
- The config (configuration_pp_chart2table.py `PPChart2TableVisionConfig`, SAM ViT-B's): hidden_size 768,
  output_channels 256, 12 layers, 12 heads, image_size 1024, patch_size 16, mlp_dim 3072, gelu, qkv_bias true,
  use_abs_pos and use_rel_pos true, window_size 14, global_attn_indexes (2, 5, 8, 11). `PPChart2TableConfig`: an
  omitted text_config is a qwen2 of 1024 wide, 24 layers, 16 heads (`sub_configs_defaults` init_kwargs), tied.
- The tower (`GotOcr2VisionEncoder`): `GotOcr2PatchEmbeddings` (a Conv2d of patch_size stride, with bias, refusing any
  input but image_size × image_size), `pos_embed` [1, g, g, width] (g = image_size / patch_size) added, then
  `num_hidden_layers` `GotOcr2VisionLayer`s (each a GradientCheckpointingLayer): layer_norm1 → `GotOcr2VisionAttention`
  on 14 × 14 windows (the grid zero-padded to whole windows, `window_partition`) or, at a global_attn_indexes layer,
  on the whole grid — `qkv` (width → 3 · width) and `proj` Linears, eager attention with fp32 softmax and decomposed
  relative positions (`rel_pos_h`/`rel_pos_w`, (2 · s − 1) × head_dim each, s the window or the grid side) → residual
  → layer_norm2 → `GotOcr2MLPBlock` lin1 → GELU → lin2 → residual; then `GotOcr2VisionNeck`: conv1 (1 × 1, width →
  output_channels, no bias), a channels-first LayerNorm, conv2 (3 × 3, no bias), a LayerNorm.
- The projector (`GotOcr2MultiModalProjector`): conv_upsampler1 (3 × 3 stride 2, output_channels → 2 ·
  output_channels, no bias), conv_upsampler2 (3 × 3 stride 2 → the text width, no bias), flattened, and the
  `multimodal_projector` Linear (text width → text width, with bias): ⌈⌈g / 2⌉ / 2⌉² image tokens per image.
- The processor (processing_pp_chart2table.py `PPChart2TableProcessor`, a bare ProcessorMixin, and
  image_processing_pil_pp_chart2table.py: a 1024 × 1024 resize): one fixed square per image, no tiles; it expands no
  image token (no `image_token` attribute), the chat template writes the image's tokens itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpcmem.errors import Problems, SpecError
from hpcmem.models.tower_base import (TowerBase, TowerLinear, check_activation, check_counts, check_heads,
                                      check_whole_grid, text_width, vision_values)

# configuration_pp_chart2table.py `PPChart2TableVisionConfig`'s field defaults
GOT_OCR2_VISION_DEFAULTS: dict[str, Any] = {
    "hidden_size": 768, "output_channels": 256, "num_hidden_layers": 12, "num_attention_heads": 12,
    "num_channels": 3, "image_size": 1024, "patch_size": 16, "hidden_act": "gelu", "qkv_bias": True,
    "use_abs_pos": True, "use_rel_pos": True, "window_size": 14, "global_attn_indexes": (2, 5, 8, 11),
    "mlp_dim": 3072}
# configuration_pp_chart2table.py `PPChart2TableConfig.sub_configs_defaults`: the qwen2 text config an omitted
# text_config builds
PP_CHART2TABLE_TEXT_DEFAULTS: dict[str, Any] = {
    "model_type": "qwen2", "vocab_size": 151860, "hidden_size": 1024, "intermediate_size": 2816,
    "num_hidden_layers": 24, "num_attention_heads": 16, "num_key_value_heads": 16, "hidden_act": "silu",
    "max_position_embeddings": 32768, "initializer_range": 0.02, "rms_norm_eps": 1e-6, "use_cache": True,
    "tie_word_embeddings": True, "rope_theta": 1000000.0, "rope_parameters": None, "use_sliding_window": False,
    "sliding_window": 4096, "max_window_layers": 21, "attention_dropout": 0.0}
PP_CHART2TABLE_HIDDEN = 1024


def half_up(side: int) -> int:
    """A 3 × 3, stride 2, padding 1 Conv2d's output side (`GotOcr2MultiModalProjector`'s conv_upsampler1/2)."""
    return (side + 2 - 3) // 2 + 1


@dataclass(frozen=True, kw_only=True)
class GotOcr2TowerSpec(TowerBase):
    """GOT-OCR 2.0's SAM-style ViTDet tower and its neck, under the convolution projector (the "merger")."""

    image_size: int
    output_channels: int
    window_size: int
    global_attn_indexes: tuple[int, ...]
    qkv_bias: bool = True
    use_abs_pos: bool = True
    use_rel_pos: bool = True
    # what the shared vision code reads of a tower (hpcmem.models.vision_spec.VisionSpec's names): GotOcr2VisionEncoder
    # names patch_embed its input embeddings (`get_input_embeddings`), which `enable_input_require_grads` hooks
    norm: str = "layer"
    mlp: str = "fc"
    deepstack_visual_indexes: tuple[int, ...] = ()
    deepstack_params: int = 0
    hooked_input: bool = True
    fixed_resolution: bool = True
    family: str = "got_ocr2"

    def __post_init__(self) -> None:
        p = Problems()
        check_counts(p, self, ("depth", "hidden_size", "intermediate_size", "num_heads", "in_channels", "image_size",
                               "patch_size", "out_hidden_size", "output_channels", "window_size"))
        p.raise_if_any()
        check_heads(p, self.hidden_size, self.num_heads, "num_attention_heads")
        check_activation(p, self.hidden_act, ("gelu",))
        check_whole_grid(p, self.image_size, self.patch_size)
        p.check(all(0 <= i < self.depth for i in self.global_attn_indexes),
                f"vision_config.global_attn_indexes {list(self.global_attn_indexes)} must name layers of the "
                f"{self.depth}")
        p.raise_if_any()

    @property
    def grid(self) -> int:
        """The patch grid's side: image_size / patch_size."""
        return self.image_size // self.patch_size

    @property
    def patches(self) -> int:
        return self.grid ** 2

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def global_layers(self) -> int:
        return len(set(self.global_attn_indexes))

    @property
    def window_layers(self) -> int:
        return self.depth - self.global_layers

    @property
    def padded_grid(self) -> int:
        """`GotOcr2VisionLayer.window_partition`: the grid zero-padded to whole windows."""
        return -(-self.grid // self.window_size) * self.window_size

    @property
    def windows(self) -> int:
        return (self.padded_grid // self.window_size) ** 2

    @property
    def token_side(self) -> int:
        return half_up(half_up(self.grid))

    @property
    def tokens_per_image(self) -> int:
        return self.token_side ** 2

    def linears(self) -> tuple[TowerLinear, ...]:
        """Every nn.Linear, names below `vision_tower.layers.N.` / `multi_modal_projector.`: attn.qkv / attn.proj,
        mlp.lin1 / mlp.lin2 per layer, the projector's multimodal_projector (the patch embedding, neck and
        upsamplers are Conv2d)."""
        h, i, d, t = self.hidden_size, self.intermediate_size, self.depth, self.out_hidden_size
        return (TowerLinear(name="attn.qkv", in_features=h, out_features=3 * h, count=d, part="tower",
                            bias=self.qkv_bias),
                TowerLinear(name="attn.proj", in_features=h, out_features=h, count=d, part="tower"),
                TowerLinear(name="mlp.lin1", in_features=h, out_features=i, count=d, part="tower"),
                TowerLinear(name="mlp.lin2", in_features=i, out_features=h, count=d, part="tower"),
                TowerLinear(name="multimodal_projector", in_features=t, out_features=t, count=1, part="merger"))

    def _rel_pos(self, side: int) -> int:
        return 2 * (2 * side - 1) * self.head_dim if self.use_rel_pos else 0

    def layer_params(self, global_attention: bool) -> int:
        """One layer: its four linears, two LayerNorms, rel_pos_h/rel_pos_w over the grid or the window."""
        own = sum(x.params // x.count for x in self.linears() if x.part == "tower") + 4 * self.hidden_size
        return own + self._rel_pos(self.grid if global_attention else self.window_size)

    @property
    def block_params(self) -> int:
        return self.layer_params(self.global_layers > 0)

    @property
    def embed_params(self) -> int:
        """The patch Conv2d (weight and bias) and pos_embed."""
        h = self.hidden_size
        return self.patch_dim * h + h + (self.patches * h if self.use_abs_pos else 0)

    @property
    def neck_params(self) -> int:
        """`GotOcr2VisionNeck`: conv1 (1 × 1), conv2 (3 × 3), no biases, two LayerNorms."""
        c = self.output_channels
        return self.hidden_size * c + 9 * c * c + 4 * c

    @property
    def tower_params(self) -> int:
        return (self.embed_params + self.global_layers * self.layer_params(True)
                + self.window_layers * self.layer_params(False) + self.neck_params)

    @property
    def merger_params(self) -> int:
        """`GotOcr2MultiModalProjector`: the two 3 × 3 upsamplers (no biases) and the Linear."""
        c, t = self.output_channels, self.out_hidden_size
        return 9 * c * 2 * c + 9 * 2 * c * t + t * t + t

    @property
    def num_params(self) -> int:
        return self.tower_params + self.merger_params


def got_ocr2_tower_from_config(cfg: dict[str, Any], name: str) -> GotOcr2TowerSpec:
    """The GotOcr2TowerSpec of a pp_chart2table config.json dict; keys it omits take the config classes' defaults."""
    vc = vision_values(cfg, name, GOT_OCR2_VISION_DEFAULTS)
    if vc.get("model_type", "pp_chart2table_vision") != "pp_chart2table_vision":
        raise SpecError(f"model {name}: pp_chart2table's vision_config.model_type {vc.get('model_type')!r} is not "
                        "modelled; hpcmem models its own GOT-OCR 2.0 tower (pp_chart2table_vision)")
    for key in ("image_size", "patch_size"):
        if isinstance(vc[key], (list, tuple)):
            raise SpecError(f"model {name}: vision_config.{key} {vc[key]!r}: hpcmem models square images (an integer)")
    if not vc["use_rel_pos"] or not vc["use_abs_pos"]:
        raise SpecError(f"model {name}: vision_config use_abs_pos/use_rel_pos false: hpcmem derives the attention "
                        "with relative positions and the absolute table only (PPChart2TableVisionConfig's defaults)")
    return GotOcr2TowerSpec(
        model_type="pp_chart2table", depth=vc["num_hidden_layers"], hidden_size=vc["hidden_size"],
        intermediate_size=vc["mlp_dim"], num_heads=vc["num_attention_heads"], in_channels=vc["num_channels"],
        patch_size=vc["patch_size"], image_size=vc["image_size"], out_hidden_size=text_width(cfg,
                                                                                             PP_CHART2TABLE_HIDDEN),
        hidden_act=str(vc["hidden_act"]), output_channels=vc["output_channels"], window_size=vc["window_size"],
        global_attn_indexes=tuple(vc["global_attn_indexes"] or ()), qkv_bias=bool(vc["qkv_bias"]),
        use_abs_pos=bool(vc["use_abs_pos"]), use_rel_pos=bool(vc["use_rel_pos"]))

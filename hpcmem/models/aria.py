"""AriaTowerSpec: Aria's vision tower and projector (model_type "aria"), as its config.json's `vision_config` and
`projector_patch_to_query_dict` describe them, their linear layers, parameter count and the image processor's
resize (transformers 5.24 models/aria/modular_aria.py).

- The tower (`AriaConfig.sub_configs_defaults`: vision_config an idefics3_vision config, `LlavaModel.__init__`'s
  `AutoModel.from_config`: `Idefics3VisionTransformer`): Idefics3's SigLIP-style layers (hpcmem.models.idefics3),
  run over each image's max_image_size² square with the patch mask `AriaModel._create_patch_attention_mask` makes of
  the processor's pixel_mask. `AriaModel.get_image_features` reads `hidden_states[vision_feature_layer]` (-1: the
  last layer's output, before post_layernorm): post_layernorm runs, its output off the loss's path.
- The projector (`AriaProjector`): `query` [max(patch_to_query.values()), width], the first
  patch_to_query[patches] of them repeated per image; `AriaCrossAttention`: layer_norm(queries) → q_proj,
  layer_norm_kv(patch features) → k_proj, v_proj (no bias), `nn.MultiheadAttention(width, heads, batch_first=True)`
  (in_proj_weight [3 · width, width] and in_proj_bias: Parameters, not Linears; out_proj a Linear with bias) with
  the padded patches masked, `linear` (bias); then `layer_norm` → `AriaProjectorMLP`: linear_in (width → text width,
  no bias) → gelu_new → linear_out (text width → text width, no bias).
- The image processor (`AriaImageProcessor`, `AriaProcessor.images_kwargs`: max_image_size 980, split_image False):
  each image resized so its longest side is max_image_size (the other int() of the scaled side, at least
  min_image_size 336), padded right and bottom to max_image_size², a bool pixel_mask of the real pixels; the image's
  tokens `AriaProcessor.size_conversion[max_image_size]` ({490: 128, 980: 256}), which equal
  patch_to_query[(max_image_size / 14)²] at the class defaults. Splitting (split_image True) is not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpcmem.errors import SpecError
from hpcmem.models.idefics3 import IDEFICS3_VISION_DEFAULTS, Idefics3TowerSpec
from hpcmem.models.tower_base import TowerLinear, text_width

# AriaConfig.__post_init__'s default projector_patch_to_query_dict
PATCH_TO_QUERY = {1225: 128, 4900: 256}
# AriaImageProcessor's class defaults (max_image_size, min_image_size; AriaProcessor.images_kwargs max_image_size 980)
MAX_IMAGE_SIZE, MIN_IMAGE_SIZE = 980, 336
# AriaTextConfig(LlamaConfig)'s field defaults where they differ from LlamaConfig's, and the MoE fields
ARIA_TEXT_DEFAULTS: dict[str, Any] = {
    "model_type": "aria_text", "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 4096,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": None, "moe_num_experts": 8,
    "moe_topk": 2, "moe_num_shared_experts": 2, "pad_token_id": 2}


@dataclass(frozen=True, kw_only=True)
class AriaTowerSpec(Idefics3TowerSpec):
    """Idefics3's tower with Aria's projector: `patch_to_query` the config's projector_patch_to_query_dict (as
    (patches, queries) pairs), `text_hidden` the text width (linear_in's and linear_out's output)."""

    patch_to_query: tuple[tuple[int, int], ...]
    min_image_size: int = MIN_IMAGE_SIZE
    family: str = "aria"

    @property
    def fold_problem(self) -> str | None:
        """AriaProjector.forward raises KeyError when an image's patch count is no key of patch_to_query."""
        if self.tile % self.patch_size == 0 and self.patches in dict(self.patch_to_query):
            return None
        return (f"aria: max_image_size {self.tile} / patch_size {self.patch_size} gives {self.patches} patches, no "
                f"key of projector_patch_to_query_dict {dict(self.patch_to_query)}; AriaProjector.forward raises")

    @property
    def tokens_per_tile(self) -> int:
        """AriaProjector's queries for one image: patch_to_query[(max_image_size / patch_size)²]."""
        return dict(self.patch_to_query).get(self.patches, 0)

    @property
    def max_queries(self) -> int:
        return max(q for _, q in self.patch_to_query)

    def linears(self) -> tuple[TowerLinear, ...]:
        h, t = self.hidden_size, self.out_hidden_size
        tower = tuple(x for x in super().linears() if x.part == "tower")
        cross = tuple(TowerLinear(name=f"multi_modal_projector.cross_attn.{n}", in_features=h, out_features=h,
                                  count=1, part="merger", bias=False) for n in ("q_proj", "k_proj", "v_proj"))
        return (*tower, *cross,
                # nn.MultiheadAttention's out_proj (NonDynamicallyQuantizableLinear, an nn.Linear with bias)
                TowerLinear(name="multi_modal_projector.cross_attn.multihead_attn.out_proj", in_features=h,
                            out_features=h, count=1, part="merger"),
                TowerLinear(name="multi_modal_projector.cross_attn.linear", in_features=h, out_features=h, count=1,
                            part="merger"),
                TowerLinear(name="multi_modal_projector.feed_forward.linear_in", in_features=h, out_features=t,
                            count=1, part="merger", bias=False),
                TowerLinear(name="multi_modal_projector.feed_forward.linear_out", in_features=t, out_features=t,
                            count=1, part="merger", bias=False))

    @property
    def merger_params(self) -> int:
        """The projector: its linears, `query`, MultiheadAttention's in_proj_weight and in_proj_bias, and three
        LayerNorms (cross_attn.layer_norm, cross_attn.layer_norm_kv, layer_norm)."""
        h = self.hidden_size
        linear = sum(x.params for x in self.linears() if x.part == "merger")
        return linear + self.max_queries * h + 3 * h * h + 3 * h + 3 * 2 * h

    @property
    def num_params(self) -> int:
        return self.tower_params + self.merger_params

    def resized(self, height: int, width: int) -> tuple[int, int]:
        """AriaImageProcessor._preprocess (split_image False): the longest side to max_image_size, the other
        max(int(side · scale), min_image_size), before the padding to max_image_size²."""
        scale = self.tile / max(height, width)
        if width >= height:
            return max(int(height * scale), self.min_image_size), self.tile
        return self.tile, max(int(width * scale), self.min_image_size)

    def real_patches(self, height: int, width: int) -> int:
        """Patches with a real pixel (`AriaModel._create_patch_attention_mask`: any pixel of the patch in
        pixel_mask): ceil(resized side / patch_size) each way."""
        h, w = self.resized(height, width)
        return -(-h // self.patch_size) * -(-w // self.patch_size)


def aria_tower_from_config(cfg: dict[str, Any], name: str) -> AriaTowerSpec:
    """The AriaTowerSpec of an aria config.json dict; keys it omits take Idefics3VisionConfig's and AriaConfig's
    defaults, the processor's AriaImageProcessor's class defaults."""
    raw = cfg.get("vision_config") or {}
    if not isinstance(raw, dict):
        raise SpecError(f"model {name}: vision_config must be an object, got {type(raw).__name__}")
    vc = {**IDEFICS3_VISION_DEFAULTS, **raw}
    for key in ("image_size", "patch_size"):
        if isinstance(vc[key], (list, tuple)):
            raise SpecError(f"model {name}: vision_config.{key} {vc[key]!r}: hpcmem models square tiles (an integer)")
    if cfg.get("vision_feature_layer", -1) != -1:
        raise SpecError(f"model {name}: vision_feature_layer {cfg['vision_feature_layer']!r}: hpcmem models Aria's "
                        "projector over the tower's last layer only (-1, the class default)")
    ptq = cfg.get("projector_patch_to_query_dict") or PATCH_TO_QUERY
    width = text_width(cfg, ARIA_TEXT_DEFAULTS["hidden_size"])
    return AriaTowerSpec(
        model_type=str(cfg["model_type"]), depth=vc["num_hidden_layers"], hidden_size=vc["hidden_size"],
        intermediate_size=vc["intermediate_size"], num_heads=vc["num_attention_heads"], in_channels=vc["num_channels"],
        image_size=vc["image_size"], patch_size=vc["patch_size"], out_hidden_size=width,
        hidden_act=str(vc["hidden_act"]), scale_factor=1, tile=MAX_IMAGE_SIZE, longest_edge=MAX_IMAGE_SIZE,
        patch_to_query=tuple(sorted((int(k), int(v)) for k, v in ptq.items())))

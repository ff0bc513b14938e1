"""DeepseekVLHybridTowerSpec: DeepSeek-VL hybrid's (model_type "deepseek_vl_hybrid") two vision towers and aligner, as
its config.json's `vision_config`, `high_res_vision_config` and outer keys describe them, their linear layers and
parameter count (transformers 5.24 models/deepseek_vl_hybrid/modular_deepseek_vl_hybrid.py).

- The config (`DeepseekVLHybridConfig`): `sub_configs_defaults` builds an omitted `vision_config` as a bare
  `siglip_vision_model` config (SiglipVisionConfig's class defaults), an omitted `high_res_vision_config` as a bare
  `sam_vision_model` one (models/sam/configuration_sam.py `SamVisionConfig`'s class defaults, `SAM_DEFAULTS`) and an
  omitted `text_config` as a bare `llama` one; `image_token_id` 100015, `tie_word_embeddings` True.
- The low-resolution tower (`DeepseekVLHybridModel.vision_model`): SiglipVisionModel read whole
  (`get_low_res_image_features`: its last_hidden_state), as DeepSeek-VL's (hpcmem.models.deepseek_vl).
- The high-resolution tower (`high_res_vision_model`, models/sam/modeling_sam.py `SamVisionEncoder`): a Conv2d patch
  embedding (bias) to [B, G, G, width] (G = image_size / patch_size), an absolute position table [1, G, G, width]
  (`use_abs_pos`), `num_hidden_layers` `SamVisionLayer`s — layer_norm1, attention (`qkv` one Linear width → 3·width,
  `proj`; decomposed relative positions `rel_pos_h`/`rel_pos_w` [2·S − 1, head_dim], S the window or, for a layer
  in `global_attn_indexes`, G), layer_norm2, `SamMLPBlock` (lin1 → act → lin2) — windowed over `window_size`² windows
  (the grid padded to a multiple) except the global layers, and `SamVisionNeck` (conv1 1×1 width → output_channels,
  no bias; a channels-first LayerNorm; conv2 3×3, no bias; a LayerNorm): its last_hidden_state [B, C, G, G].
- Around it (`get_high_res_image_features`): the hidden state after layer `global_attn_indexes[0]` through a second
  neck of the same shapes (`DeepseekVLSamVisionNeck`), both through `DeepseekVLSamVisionProj` (bilinear interpolate
  to 4·O, O = SigLIP's image_size / patch_size, then conv1 3×3/2 C → 2C and conv2 3×3/2 2C → 4C, no biases) and
  added, the second times the scalar `high_res_vision_alpha`: [B, O², 4C].
- The aligner (`DeepseekVLHybridAligner`): vision_proj (SigLIP width → text width / 2) and high_res_vision_proj
  (4C → text width / 2), concatenated (high-res first), GELU, proj (text width → text width); every SigLIP patch is
  an image token, O² per image.
- The processor (processing_deepseek_vl_hybrid.py `DeepseekVLHybridProcessor`): `num_image_tokens` image tokens per
  image and nothing around them. Its image processor (image_processing_pil_deepseek_vl_hybrid.py
  `DeepseekVLHybridImageProcessorPil`) makes two fixed sizes whatever the image: `size` (the longest edge resized,
  padded to a square) for SigLIP and `high_res_size` likewise for SAM, whose patch embedding raises on any other size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpcmem.errors import Problems, SpecError
from hpcmem.models.deepseek_vl import LLAMA_HIDDEN, DeepseekVLTowerSpec
from hpcmem.models.siglip import SIGLIP_DEFAULTS
from hpcmem.models.tower_base import TowerLinear, check_counts, check_whole_grid, encoder_layer_linears, text_width

# SamVisionConfig's class defaults (models/sam/configuration_sam.py), the high-resolution tower of an omitted or
# partial high_res_vision_config
SAM_DEFAULTS: dict[str, Any] = {
    "hidden_size": 768, "output_channels": 256, "num_hidden_layers": 12, "num_attention_heads": 12,
    "num_channels": 3, "image_size": 1024, "patch_size": 16, "hidden_act": "gelu", "qkv_bias": True,
    "mlp_ratio": 4.0, "use_abs_pos": True, "use_rel_pos": True, "window_size": 14,
    "global_attn_indexes": [2, 5, 8, 11], "mlp_dim": None}


@dataclass(frozen=True, kw_only=True)
class DeepseekVLHybridTowerSpec(DeepseekVLTowerSpec):
    """DeepSeek-VL's SigLIP tower (the inherited fields) beside a SAM ViT-B-style high-resolution tower (the sam_
    fields), under the hybrid aligner; `out_hidden_size` is the text width."""

    sam_depth: int
    sam_hidden: int
    sam_mlp: int
    sam_heads: int
    sam_channels: int           # output_channels: the necks' width; the aligner reads 4 × that
    sam_image_size: int
    sam_patch: int
    sam_in_channels: int = 3
    window_size: int
    global_layers: tuple[int, ...]      # the global_attn_indexes inside the tower
    sam_qkv_bias: bool = True
    use_abs_pos: bool = True
    use_rel_pos: bool = True
    sam_act: str = "gelu"
    family: str = "deepseek_vl_hybrid"

    def __post_init__(self) -> None:
        super().__post_init__()
        p = Problems()
        check_counts(p, self, ("sam_depth", "sam_hidden", "sam_mlp", "sam_heads", "sam_channels", "sam_image_size",
                               "sam_patch"), prefix="high_res_vision_config.")
        p.raise_if_any()
        check_whole_grid(p, self.sam_image_size, self.sam_patch)
        if self.sam_hidden % self.sam_heads:
            p.add(f"high_res_vision_config.hidden_size {self.sam_hidden} is not a multiple of num_attention_heads "
                  f"{self.sam_heads}")
        if not self.global_layers:
            # DeepseekVLHybridModel.get_high_res_image_features reads hidden_states[global_attn_indexes[0] + 1]
            p.add("high_res_vision_config.global_attn_indexes names no layer of the tower: DeepseekVLHybridModel "
                  "reads the hidden state after global_attn_indexes[0]")
        if self.window_size < 1:
            p.add("high_res_vision_config.window_size 0 (every layer global) is not modelled")
        p.raise_if_any()

    # -- the high-resolution tower's geometry
    @property
    def sam_grid(self) -> int:
        """G: the SAM patch grid's side (SamPatchEmbeddings, stride patch_size)."""
        return self.sam_image_size // self.sam_patch

    @property
    def sam_padded(self) -> int:
        """The grid's side padded to a multiple of window_size (SamVisionLayer.window_partition's F.pad)."""
        return -(-self.sam_grid // self.window_size) * self.window_size

    @property
    def sam_windows(self) -> int:
        """Windows per image of a windowed layer."""
        return (self.sam_padded // self.window_size) ** 2

    @property
    def output_size(self) -> int:
        """O: DeepseekVLHybridModel.output_size, SigLIP's image_size // patch_size (the projection's output side)."""
        return self.image_size // self.patch_size

    def sam_global(self, layer: int) -> bool:
        return layer in self.global_layers

    @property
    def sam_rel_pos_params(self) -> int:
        """rel_pos_h and rel_pos_w of every layer: [2·S − 1, head_dim] each, S the window or the grid."""
        if not self.use_rel_pos:
            return 0
        hd = self.sam_hidden // self.sam_heads
        return sum(2 * (2 * (self.sam_grid if self.sam_global(i) else self.window_size) - 1) * hd
                   for i in range(self.sam_depth))

    @property
    def sam_params(self) -> int:
        """SamVisionEncoder (patch embedding with bias, position table, layers, its neck) plus DeepseekVLHybridModel's
        second neck (DeepseekVLSamVisionNeck), projection (DeepseekVLSamVisionProj) and high_res_vision_alpha."""
        h, c, g = self.sam_hidden, self.sam_channels, self.sam_grid
        embed = self.sam_in_channels * self.sam_patch ** 2 * h + h + (g * g * h if self.use_abs_pos else 0)
        linears = sum(x.params for x in self.linears() if x.part == "sam")     # TowerLinear.params: all `count`
        layers = linears + self.sam_depth * 4 * h + self.sam_rel_pos_params
        neck = h * c + 2 * c + 9 * c * c + 2 * c
        proj = 9 * c * 2 * c + 9 * 2 * c * 4 * c
        return embed + layers + 2 * neck + proj + 1

    @property
    def tower_params(self) -> int:
        return super().tower_params + self.sam_params

    @property
    def merged_width(self) -> int:
        """The projection's channels, high_res_vision_proj's input: 4 · output_channels."""
        return 4 * self.sam_channels

    def linears(self) -> tuple[TowerLinear, ...]:
        h, i, d, o = self.hidden_size, self.intermediate_size, self.depth, self.out_hidden_size
        sh, sm, sd = self.sam_hidden, self.sam_mlp, self.sam_depth
        return (*encoder_layer_linears(h, i, d),
                TowerLinear(name="attn.qkv", in_features=sh, out_features=3 * sh, count=sd, part="sam",
                            bias=self.sam_qkv_bias),
                TowerLinear(name="attn.proj", in_features=sh, out_features=sh, count=sd, part="sam"),
                TowerLinear(name="mlp.lin1", in_features=sh, out_features=sm, count=sd, part="sam"),
                TowerLinear(name="mlp.lin2", in_features=sm, out_features=sh, count=sd, part="sam"),
                TowerLinear(name="aligner.vision_proj", in_features=h, out_features=o // 2, count=1, part="merger"),
                TowerLinear(name="aligner.high_res_vision_proj", in_features=self.merged_width,
                            out_features=o // 2, count=1, part="merger"),
                TowerLinear(name="aligner.proj", in_features=o, out_features=o, count=1, part="merger"))


def deepseek_vl_hybrid_tower_from_config(cfg: dict[str, Any], name: str) -> DeepseekVLHybridTowerSpec:
    """The DeepseekVLHybridTowerSpec of a deepseek_vl_hybrid config.json dict; keys it omits take SiglipVisionConfig's
    and SamVisionConfig's class defaults."""
    raw, hi = cfg.get("vision_config"), cfg.get("high_res_vision_config")
    for key, value in (("vision_config", raw), ("high_res_vision_config", hi)):
        if value is not None and not isinstance(value, dict):
            raise SpecError(f"model {name}: {key} must be an object, got {type(value).__name__}")
    if raw is not None and raw.get("model_type", "siglip_vision_model") != "siglip_vision_model":
        raise SpecError(f"model {name}: deepseek_vl_hybrid's vision_config.model_type {raw.get('model_type')!r} is "
                        "not modelled; hpcmem models it with a SigLIP tower (siglip_vision_model)")
    if hi is not None and hi.get("model_type", "sam_vision_model") != "sam_vision_model":
        raise SpecError(f"model {name}: deepseek_vl_hybrid's high_res_vision_config.model_type "
                        f"{hi.get('model_type')!r} is not modelled; hpcmem models it with a SAM tower "
                        "(sam_vision_model)")
    vc = {**SIGLIP_DEFAULTS, **(raw or {})}
    sc = {**SAM_DEFAULTS, **(hi or {})}
    for key, value in (("vision_config.image_size", vc["image_size"]), ("vision_config.patch_size", vc["patch_size"]),
                       ("high_res_vision_config.image_size", sc["image_size"]),
                       ("high_res_vision_config.patch_size", sc["patch_size"])):
        if isinstance(value, (list, tuple)):
            raise SpecError(f"model {name}: {key} {value!r}: hpcmem models square images (an integer)")
    # SamVisionConfig.__post_init__: mlp_dim = int(hidden_size * mlp_ratio) when None
    mlp = sc["mlp_dim"] if sc["mlp_dim"] is not None else int(sc["hidden_size"] * sc["mlp_ratio"])
    width = text_width(cfg, LLAMA_HIDDEN)
    gl = tuple(int(x) for x in sc["global_attn_indexes"] if 0 <= int(x) < sc["num_hidden_layers"])
    if sc["global_attn_indexes"] and int(sc["global_attn_indexes"][0]) >= sc["num_hidden_layers"]:
        gl = ()     # get_high_res_image_features reads hidden_states[global_attn_indexes[0] + 1]: refused below
    return DeepseekVLHybridTowerSpec(
        model_type="deepseek_vl_hybrid", depth=vc["num_hidden_layers"], hidden_size=vc["hidden_size"],
        intermediate_size=vc["intermediate_size"], num_heads=vc["num_attention_heads"],
        in_channels=vc["num_channels"], image_size=vc["image_size"], patch_size=vc["patch_size"],
        out_hidden_size=width, hidden_act=str(vc["hidden_act"]), pooling_head=bool(vc.get("vision_use_head")),
        sam_depth=sc["num_hidden_layers"], sam_hidden=sc["hidden_size"], sam_mlp=mlp,
        sam_heads=sc["num_attention_heads"], sam_channels=sc["output_channels"], sam_image_size=sc["image_size"],
        sam_patch=sc["patch_size"], sam_in_channels=sc["num_channels"], window_size=sc["window_size"],
        global_layers=gl, sam_qkv_bias=bool(sc["qkv_bias"]), use_abs_pos=bool(sc["use_abs_pos"]),
        use_rel_pos=bool(sc["use_rel_pos"]), sam_act=str(sc["hidden_act"]))

"""Idefics2TowerSpec: Idefics2's (model_type "idefics2") vision tower and connector, as its config.json's
`vision_config`, `perceiver_config` and `text_config` describe them, their linear layers, parameter count and the image
processor's resize (transformers 5.24 models/idefics2).

- The tower (modeling_idefics2.py `Idefics2VisionTransformer`): Idefics3's SigLIP-style tower, the same code
  (hpcmem.models.idefics3): a Conv2d patch embedding with bias, a learned position table of (image_size /
  patch_size)² rows bucketed onto each image's patch grid, `num_hidden_layers` encoder layers (LayerNorm →
  q/k/v/out_proj with biases → LayerNorm → fc1 → gelu_pytorch_tanh → fc2 with biases) and `post_layernorm`. Only its
  class defaults differ (`Idefics2VisionConfig`: 768 wide, 12 heads, 12 layers).
- The connector (`Idefics2Connector`), where Idefics3 has pixel_shuffle and one Linear:
  `modality_projection`, an `Idefics2MLP` (gate_proj, up_proj: vision hidden_size → text intermediate_size,
  down_proj → text hidden_size, no biases, the text config's hidden_act) on every patch row, then
  `perceiver_resampler` (`Idefics2PerceiverResampler`): `resampler_n_latents` learned latents [n_latents, text
  hidden] per image, `resampler_depth` `Idefics2PerceiverLayer`s (RMSNorms on the latents and on the context;
  cross-attention whose queries are the latents and whose keys and values are the concatenation [context, latents],
  q/o_proj of resampler_n_heads × resampler_head_dim, k/v_proj of num_key_value_heads × resampler_head_dim, no
  biases; post_attention_layernorm; a gated MLP hidden → 4·hidden → hidden with perceiver_config.hidden_act) and a
  final RMSNorm. Each image becomes n_latents image tokens whatever its size (`Idefics2Model.image_seq_len`).
  `Idefics2Config.__post_init__` sets perceiver_config.hidden_size to the text width when they differ.
- The image processor (image_processing_pil_idefics2.py `Idefics2ImageProcessorPil`, class defaults
  `size` {"shortest_edge": 378, "longest_edge": 980}, `do_image_splitting` False): each image resized so its longest
  side is at most longest_edge and each side at least shortest_edge (`get_resize_output_image_size`), then padded
  to the batch's largest image; the tower's rows per image are (height // patch_size) · (width // patch_size)
  (the Conv2d's valid windows). Idefics2's config names no processor setting, so hpcmem takes the class defaults;
  image splitting (4 crops and the image, each padded to the largest, so a patch mask) is not modelled.
- The text model is a Mistral (`sub_configs_defaults` text_config: mistral with max_position_embeddings 32768,
  rms_norm_eps 1e-5, pad_token_id 0); `Idefics2Config.tie_word_embeddings` False.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpcmem.errors import Problems, SpecError
from hpcmem.models.siglip import SiglipTowerCounts
from hpcmem.models.tower_base import (LinearTower, TowerLinear, check_activation, check_counts, check_heads,
                                      encoder_layer_linears, grid_patches)

# configuration_idefics2.py `Idefics2VisionConfig` class defaults
IDEFICS2_VISION_DEFAULTS: dict[str, Any] = {
    "hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
    "num_channels": 3, "image_size": 224, "patch_size": 32, "hidden_act": "gelu_pytorch_tanh"}
# configuration_idefics2.py `Idefics2PerceiverConfig` class defaults
IDEFICS2_PERCEIVER_DEFAULTS: dict[str, Any] = {
    "hidden_act": "silu", "hidden_size": 4096, "resampler_n_latents": 64, "resampler_depth": 3,
    "resampler_n_heads": 16, "resampler_head_dim": 96, "num_key_value_heads": 4}
# `Idefics2Config.sub_configs_defaults` text_config: MistralConfig's class defaults with these init_kwargs
IDEFICS2_TEXT_DEFAULTS: dict[str, Any] = {
    "model_type": "mistral", "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_act": "silu",
    "max_position_embeddings": 4096 * 8, "rms_norm_eps": 1e-5, "pad_token_id": 0, "sliding_window": 4096}
SHORTEST_EDGE, LONGEST_EDGE = 378, 980      # Idefics2ImageProcessorPil.size
# the tower MLP activations whose saved tensors hpcmem.estimate derives (fc1 → act → fc2), and the connector's gated
# MLPs' (act_fn(gate) keeps its input)
ACTIVATIONS = ("gelu_pytorch_tanh", "gelu")
GATED_ACTIVATIONS = ("silu",)


def idefics2_resize(height: int, width: int, shortest: int = SHORTEST_EDGE,
                    longest: int = LONGEST_EDGE) -> tuple[int, int]:
    """image_processing_pil_idefics2.py `get_resize_output_image_size`, line for line: the longer side down to
    `longest` (the other by the aspect ratio, int()), then each side up to at least `shortest`."""
    aspect = width / height
    if width >= height and width > longest:
        width = longest
        height = int(width / aspect)
    elif height > width and height > longest:
        height = longest
        width = int(height * aspect)
    return max(height, shortest), max(width, shortest)


@dataclass(frozen=True, kw_only=True)
class Idefics2TowerSpec(SiglipTowerCounts, LinearTower):
    """Idefics2's tower and connector; `out_hidden_size` is the text width (the perceiver's width),
    `text_intermediate` and `text_act` the text config's, which size the modality projection."""

    image_size: int
    text_intermediate: int
    text_act: str
    n_latents: int
    resampler_depth: int
    resampler_heads: int
    resampler_head_dim: int
    resampler_kv_heads: int
    resampler_act: str
    shortest_edge: int = SHORTEST_EDGE
    longest_edge: int = LONGEST_EDGE
    # what the shared vision code reads of a tower (hpcmem.models.vision_spec.VisionSpec's names)
    norm: str = "layer"
    mlp: str = "fc"
    deepstack_visual_indexes: tuple[int, ...] = ()
    deepstack_params: int = 0
    hooked_input: bool = True
    family: str = "idefics2"

    def __post_init__(self) -> None:
        p = Problems()
        check_counts(p, self, ("depth", "hidden_size", "intermediate_size", "num_heads", "in_channels", "image_size",
                               "patch_size", "out_hidden_size", "text_intermediate", "n_latents", "resampler_depth",
                               "resampler_heads", "resampler_head_dim", "resampler_kv_heads"), prefix="")
        check_activation(p, self.hidden_act, ACTIVATIONS)
        for key, act in (("text_config.hidden_act", self.text_act), ("perceiver_config.hidden_act",
                                                                      self.resampler_act)):
            p.check(act in GATED_ACTIVATIONS, f"{key} {act!r}: what Idefics2MLP keeps for backward is derived only "
                                              f"for {', '.join(GATED_ACTIVATIONS)}")
        p.raise_if_any()
        check_heads(p, self.hidden_size, self.num_heads, "num_attention_heads")
        p.check(self.resampler_heads % self.resampler_kv_heads == 0,
                f"perceiver_config.resampler_n_heads {self.resampler_heads} is not a multiple of num_key_value_heads "
                f"{self.resampler_kv_heads}")
        p.raise_if_any()

    def grid(self, height: int, width: int) -> tuple[tuple[int, int], int, int]:
        """((height, width) after the processor's resize, patch rows, patch columns) of one image."""
        h, w = idefics2_resize(height, width, self.shortest_edge, self.longest_edge)
        return (h, w), h // self.patch_size, w // self.patch_size

    @property
    def tokens_per_image(self) -> int:
        """Image tokens per image: the perceiver's latents."""
        return self.n_latents

    @property
    def resampler_width(self) -> int:
        """q_proj's output and o_proj's input: resampler_n_heads · resampler_head_dim."""
        return self.resampler_heads * self.resampler_head_dim

    @property
    def resampler_kv_width(self) -> int:
        """k_proj's and v_proj's output: num_key_value_heads · resampler_head_dim."""
        return self.resampler_kv_heads * self.resampler_head_dim

    def linears(self) -> tuple[TowerLinear, ...]:
        h, i, d, t = self.hidden_size, self.intermediate_size, self.depth, self.out_hidden_size
        ti, q, kv, n = self.text_intermediate, self.resampler_width, self.resampler_kv_width, self.resampler_depth

        def lin(name: str, a: int, b: int, count: int = 1) -> TowerLinear:
            return TowerLinear(name=name, in_features=a, out_features=b, count=count, part="merger", bias=False)
        layer = "perceiver_resampler.layers"
        return (*encoder_layer_linears(h, i, d),
                lin("modality_projection.gate_proj", h, ti), lin("modality_projection.up_proj", h, ti),
                lin("modality_projection.down_proj", ti, t),
                lin(f"{layer}.self_attn.q_proj", t, q, n), lin(f"{layer}.self_attn.k_proj", t, kv, n),
                lin(f"{layer}.self_attn.v_proj", t, kv, n), lin(f"{layer}.self_attn.o_proj", q, t, n),
                lin(f"{layer}.mlp.gate_proj", t, 4 * t, n), lin(f"{layer}.mlp.up_proj", t, 4 * t, n),
                lin(f"{layer}.mlp.down_proj", 4 * t, t, n))

    @property
    def table_positions(self) -> int:
        """The position table's rows: (image_size / patch_size)², not a tile's patches."""
        return grid_patches(self.image_size, self.patch_size)

    @property
    def resampler_norm_params(self) -> int:
        """The perceiver's RMSNorm weights (three per layer and the final norm) and its latents."""
        t = self.out_hidden_size
        return (3 * self.resampler_depth + 1) * t + self.n_latents * t

    @property
    def merger_params(self) -> int:
        return sum(x.params for x in self.linears() if x.part == "merger") + self.resampler_norm_params


def idefics2_tower_from_config(cfg: dict[str, Any], name: str) -> Idefics2TowerSpec:
    """The Idefics2TowerSpec of an idefics2 config.json dict; keys it omits take the config classes' defaults."""
    parts = {}
    for key in ("vision_config", "perceiver_config", "text_config"):
        raw = cfg.get(key) or {}
        if not isinstance(raw, dict):
            raise SpecError(f"model {name}: {key} must be an object, got {type(raw).__name__}")
        parts[key] = raw
    vc = {**IDEFICS2_VISION_DEFAULTS, **parts["vision_config"]}
    pc = {**IDEFICS2_PERCEIVER_DEFAULTS, **parts["perceiver_config"]}
    tc = {**IDEFICS2_TEXT_DEFAULTS, **parts["text_config"]}
    for key in ("image_size", "patch_size"):
        if isinstance(vc[key], (list, tuple)):
            raise SpecError(f"model {name}: vision_config.{key} {vc[key]!r}: hpcmem models square patches (an integer)")
    return Idefics2TowerSpec(model_type="idefics2", depth=vc["num_hidden_layers"], hidden_size=vc["hidden_size"],
                             intermediate_size=vc["intermediate_size"], num_heads=vc["num_attention_heads"],
                             in_channels=vc["num_channels"], image_size=vc["image_size"], patch_size=vc["patch_size"],
                             out_hidden_size=tc["hidden_size"], hidden_act=str(vc["hidden_act"]),
                             text_intermediate=tc["intermediate_size"], text_act=str(tc["hidden_act"]),
                             n_latents=pc["resampler_n_latents"], resampler_depth=pc["resampler_depth"],
                             resampler_heads=pc["resampler_n_heads"], resampler_head_dim=pc["resampler_head_dim"],
                             resampler_kv_heads=pc["num_key_value_heads"], resampler_act=str(pc["hidden_act"]))

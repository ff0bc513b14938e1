"""Emu3TowerSpec: Emu3's (model_type "emu3") image path, which has no vision encoder the language model reads: a
VQ-VAE turns each image into discrete codes, and the text decoder's own token embedding embeds them (transformers 5.24
models/emu3/).

- The config (configuration_emu3.py `Emu3Config`): an omitted `vq_config` takes `Emu3VQVAEConfig`'s class defaults
  (codebook 32768 × embed_dim 4, latent_channels 4, base_channels 256, channel_multiplier (1, 2, 2, 4), two res
  blocks a level, attention at level 3, hidden_size 1024, one head, temporal_downsample_factor 4), an omitted
  `text_config` `Emu3TextConfig`'s (Llama's layout: 4096 wide, 32 layers, vocab 184622, attention_dropout 0.1), which
  has no family descriptor: a learned profile of the text config (hpcmem.models.vlm_learned). `vocabulary_map` (the
  tokenizer's vocabulary) names `<image>`, `<|extra_200|>` (the row end) and the `<|visual token NNNNNN|>` ids the
  codes map to.
- The model (modeling_emu3.py `Emu3Model.get_image_features`): `vqmodel.encode` repeats each image
  temporal_downsample_factor times (`Emu3VQVAE.encode`), runs `Emu3VQVAEEncoder` (Conv2d/GroupNorm res blocks down to
  1/8 of each side, attention blocks at the last level, a middle block, temporal Conv3d downsampling and res blocks),
  `quant_conv` and the quantizer (`Emu3VQVAEVectorQuantizer`: argmin over the codebook distances); the codes, each
  row closed by the `<|extra_200|>` id (`Emu3ImageVocabularyMapping.convert_img2bpe`), are embedded by the text
  model's `embed_tokens`. The argmin ends the graph: no VQ-VAE parameter gets a gradient (nor an optimizer state) —
  the whole VQ-VAE is part "idle", its decoder never runs. Its attention blocks' Linears (q/k/v/out_proj) are what
  peft's "all-linear" finds in it.
- The processor (image_processing_emu3.py `Emu3ImageProcessor`, class defaults: `smart_resize` to multiples of
  spatial_factor 8 within min_pixels 512² .. max_pixels 1024²; processing_emu3.py
  `Emu3Processor.replace_image_token`): per image `<|image start|>` H*W `<|image token|>`, H · (W + 1) `<image>` tokens (H, W the resized sides / 8; the
  extra column is the row end), `<|extra_201|>`, `<|image end|>`; one bos per row (`prepare_inputs_layout`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from hpcmem.errors import SpecError
from hpcmem.models.tower_base import TowerBase, TowerLinear, text_width

EMU3_TEXT_HIDDEN = 4096      # Emu3TextConfig.hidden_size: the text width of an omitted text_config
# configuration_emu3.py `Emu3VQVAEConfig`'s class defaults
EMU3_VQ_DEFAULTS: dict[str, Any] = {
    "codebook_size": 32768, "embed_dim": 4, "latent_channels": 4, "double_latent": False, "in_channels": 3,
    "out_channels": 3, "temporal_downsample_factor": 4, "base_channels": 256, "channel_multiplier": [1, 2, 2, 4],
    "num_res_blocks": 2, "attn_resolutions": [3], "hidden_size": 1024, "num_attention_heads": 1}
# image_processing_emu3.py `Emu3ImageProcessor.__init__` defaults; processing_emu3.py `Emu3Processor.downsample_ratio`
SPATIAL_FACTOR = 8
MIN_PIXELS = 512 * 512
MAX_PIXELS = 1024 * 1024
GROUPS = 32                 # every GroupNorm of the VQ-VAE (modeling_emu3.py)


def emu3_resize(height: int, width: int) -> tuple[int, int]:
    """image_processing_emu3.py `smart_resize(height, width, factor=8, min_pixels=512², max_pixels=1024²)`."""
    f = SPATIAL_FACTOR
    h_bar, w_bar = round(height / f) * f, round(width / f) * f
    if h_bar * w_bar > MAX_PIXELS:
        beta = math.sqrt((height * width) / MAX_PIXELS)
        h_bar = max(f, math.floor(height / beta / f) * f)
        w_bar = max(f, math.floor(width / beta / f) * f)
    elif h_bar * w_bar < MIN_PIXELS:
        beta = math.sqrt(MIN_PIXELS / (height * width))
        h_bar = math.ceil(height * beta / f) * f
        w_bar = math.ceil(width * beta / f) * f
    return h_bar, w_bar


def _conv(cin: int, cout: int, k: int = 3) -> int:
    """A Conv2d with bias, k × k."""
    return cin * cout * k * k + cout


def _norm(c: int) -> int:
    return 2 * c


def _spatial_norm(quant: int, c: int) -> int:
    """Emu3VQVAESpatialNorm: GroupNorm(c) and two 1×1 Conv2d (conv_y, conv_b) from the quant channels."""
    return _norm(c) + 2 * _conv(quant, c, 1)


def _resnet(cin: int, cout: int, quant: int | None = None) -> int:
    """Emu3VQVAEResnetBlock: norm1, conv1 (3×3), norm2, conv2 (3×3), nin_shortcut (1×1) when the widths differ; the
    norms GroupNorms, or SpatialNorms in the decoder."""
    n = (lambda c: _norm(c)) if quant is None else (lambda c: _spatial_norm(quant, c))
    return n(cin) + _conv(cin, cout) + n(cout) + _conv(cout, cout) + (_conv(cin, cout, 1) if cin != cout else 0)


def _temporal_resnet(c: int) -> int:
    """Emu3VQVAETemporalResnetBlock(c, c): two BatchNorm3d and two 3×3×3 Conv3d."""
    return 2 * (_norm(c) + c * c * 27 + c)


def _attention(hidden: int) -> int:
    """Emu3VQVAEAttentionBlock: q/k/v/out_proj, Linear(hidden → hidden) with bias."""
    return 4 * (hidden * hidden + hidden)


def vq_parts(vq: dict[str, Any]) -> dict[str, int]:
    """Emu3VQVAE's parameters by module (modeling_emu3.py `Emu3VQVAEEncoder`, `Emu3VQVAEDecoder`,
    `Emu3VQVAEDownBlock`, `Emu3VQVAEUpBlock`, `Emu3VQVAEMiddleBlock`, `Emu3VQVAEVectorQuantizer`, quant_conv,
    post_quant_conv)."""
    base, mult, blocks = vq["base_channels"], list(vq["channel_multiplier"]), vq["num_res_blocks"]
    levels, attn, hidden, quant = len(mult), set(vq["attn_resolutions"]), vq["hidden_size"], vq["embed_dim"]
    latent, out_ch = vq["latent_channels"], 2 * vq["latent_channels"] if vq["double_latent"] else vq["latent_channels"]
    ins, times = [1, *mult], int(math.log2(vq["temporal_downsample_factor"]))
    enc = _conv(vq["in_channels"], base)
    for i in range(levels):
        c, out = base * ins[i], base * mult[i]
        for _ in range(blocks):
            enc += _resnet(c, out) + (_attention(hidden) + _norm(out) if i in attn else 0)
            c = out
        enc += _conv(c, c) if i != levels - 1 else 0
    top = base * mult[-1]
    enc += 2 * _resnet(top, top) + _attention(hidden) + _norm(top)                   # middle_block
    enc += _norm(top) + _conv(top, out_ch)                                           # norm_out, conv_out
    enc += times * (out_ch * out_ch * 36 + out_ch) + blocks * _temporal_resnet(out_ch)
    dec = blocks * _temporal_resnet(latent) + times * (latent * latent * 27 + latent) + _conv(latent, top)
    dec += 2 * _resnet(top, top, quant) + _attention(hidden) + _spatial_norm(quant, top)
    c = top
    for i in reversed(range(levels)):
        out = base * mult[i]
        for _ in range(blocks + 1):
            dec += _resnet(c, out, quant) + (_attention(hidden) + _spatial_norm(quant, out) if i in attn else 0)
            c = out
        dec += _conv(c, c) if i != 0 else 0
    dec += _spatial_norm(quant, base * mult[0]) + _conv(base * mult[0], vq["out_channels"])
    convs = 2 * (latent * quant * 3) + quant + latent          # quant_conv, post_quant_conv: (3, 1, 1) Conv3d
    return {"encoder": enc, "decoder": dec, "quantize": vq["codebook_size"] * quant, "convs": convs}


def vq_linears(vq: dict[str, Any]) -> tuple[TowerLinear, ...]:
    """The attention blocks' q/k/v/out_proj below `vqmodel.`: the encoder's num_res_blocks per attention level and
    its middle block's, the decoder's middle block's and num_res_blocks + 1 per attention level; part "idle"."""
    hidden, blocks, levels = vq["hidden_size"], vq["num_res_blocks"], len(vq["channel_multiplier"])
    at = [i for i in sorted(set(vq["attn_resolutions"])) if 0 <= i < levels]
    where = [*((f"encoder.down_block.down.{i}.attn", blocks) for i in at), ("encoder.middle_block.attn_1", 1),
             ("decoder.middle_block.attn_1", 1), *((f"decoder.up_block.up.{i}.attn", blocks + 1) for i in at)]
    return tuple(TowerLinear(name=f"{w}.{n}", in_features=hidden, out_features=hidden, count=c, part="idle")
                 for w, c in where for n in ("q_proj", "k_proj", "v_proj", "out_proj"))


@dataclass(frozen=True, kw_only=True)
class Emu3TowerSpec(TowerBase):
    """The VQ-VAE (`vq`: its config with Emu3VQVAEConfig's defaults filled in); no tower block (`depth` 0), no
    projector: the image tokens' rows come from the text model's token embedding."""

    vq_items: tuple[tuple[str, Any], ...]     # the VQ config's keys, lists as tuples (the spec is hashed)
    image_size: int = 0            # no fixed square resize: smart_resize within 512² .. 1024² pixels
    norm: str = "layer"
    mlp: str = "fc"
    fixed_resolution: bool = False
    deepstack_visual_indexes: tuple[int, ...] = ()
    family: str = "emu3"
    hooked_input: bool = False     # Emu3Model's input embeddings are the text model's

    @property
    def vq(self) -> dict[str, Any]:
        """The VQ config, Emu3VQVAEConfig's defaults filled in."""
        return dict(self.vq_items)

    @property
    def parts(self) -> dict[str, int]:
        return vq_parts(self.vq)

    @property
    def spatial_factor(self) -> int:
        """`Emu3VQVAE.vision_spatial_factor`: 2 ** (levels − 1)."""
        return 2 ** (len(self.vq["channel_multiplier"]) - 1)

    def resized(self, height: int, width: int) -> tuple[int, int]:
        return emu3_resize(height, width)

    def grid(self, height: int, width: int) -> tuple[int, int]:
        """(rows, columns) of codes: the resized sides / 8."""
        h, w = self.resized(height, width)
        return h // SPATIAL_FACTOR, w // SPATIAL_FACTOR

    def image_patches(self, height: int, width: int) -> int:
        rows, cols = self.grid(height, width)
        return rows * cols

    def image_tokens(self, height: int, width: int) -> int:
        """`<image>` tokens of one image: rows · (columns + 1), each code row closed by the row-end id
        (`Emu3Processor.replace_image_token`, `Emu3ImageVocabularyMapping.convert_img2bpe`)."""
        rows, cols = self.grid(height, width)
        return rows * (cols + 1)

    def linears(self) -> tuple[TowerLinear, ...]:
        return vq_linears(self.vq)

    @property
    def block_params(self) -> int:
        return 0

    @property
    def tower_params(self) -> int:
        return sum(self.parts.values())

    @property
    def merger_params(self) -> int:
        return 0

    @property
    def idle_params(self) -> int:
        """The whole VQ-VAE: no gradient reaches it through the argmin."""
        return self.tower_params

    @property
    def num_params(self) -> int:
        return self.tower_params


def emu3_tower_from_config(cfg: dict[str, Any], name: str) -> Emu3TowerSpec:
    """The Emu3TowerSpec of an emu3 config.json dict; keys its vq_config omits take Emu3VQVAEConfig's defaults."""
    raw = cfg.get("vq_config")
    if raw is not None and not isinstance(raw, dict):
        raise SpecError(f"model {name}: vq_config must be an object, got {type(raw).__name__}")
    vq = {**EMU3_VQ_DEFAULTS, **{k: v for k, v in (raw or {}).items() if k in EMU3_VQ_DEFAULTS}}
    mult = list(vq["channel_multiplier"])
    if 2 ** (len(mult) - 1) != SPATIAL_FACTOR:
        raise SpecError(f"model {name}: vq_config.channel_multiplier {mult!r} downsamples by {2 ** (len(mult) - 1)}; "
                        "Emu3Processor writes the image tokens of a factor of 8 (its downsample_ratio): 4 levels")
    tdf = vq["temporal_downsample_factor"]
    if not isinstance(tdf, int) or tdf < 1 or tdf & (tdf - 1):
        raise SpecError(f"model {name}: vq_config.temporal_downsample_factor {tdf!r} must be a power of 2")
    for i in vq["attn_resolutions"]:
        if 0 <= i < len(mult) and vq["base_channels"] * mult[i] != vq["hidden_size"]:
            raise SpecError(f"model {name}: vq_config.hidden_size {vq['hidden_size']!r} must equal the channels of "
                            f"attention level {i} ({vq['base_channels'] * mult[i]}): Emu3VQVAEAttentionBlock runs "
                            "on them")
    if vq["hidden_size"] % vq["num_attention_heads"]:
        raise SpecError(f"model {name}: vq_config.hidden_size {vq['hidden_size']} is not a multiple of "
                        f"num_attention_heads {vq['num_attention_heads']}")
    for i, m in enumerate(mult):
        if (vq["base_channels"] * m) % GROUPS:
            raise SpecError(f"model {name}: vq_config level {i} has {vq['base_channels'] * m} channels, not a "
                            f"multiple of the GroupNorms' {GROUPS} groups")
    width = text_width(cfg, EMU3_TEXT_HIDDEN)
    return Emu3TowerSpec(model_type="emu3", depth=0, hidden_size=vq["hidden_size"], intermediate_size=0,
                         num_heads=vq["num_attention_heads"], in_channels=vq["in_channels"],
                         patch_size=SPATIAL_FACTOR, out_hidden_size=width, hidden_act="",
                         vq_items=tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in sorted(vq.items())))


def emu3_problems(min_pixels: Any, max_pixels: Any) -> list[str]:
    """min_pixels / max_pixels: Emu3ImageProcessor has both, but hpcmem models its class defaults (512² .. 1024²)."""
    if min_pixels is None and max_pixels is None:
        return []
    return ["min_pixels/max_pixels on emu3: not modelled; Emu3ImageProcessor's class defaults (512² .. 1024² pixels, "
            "sides multiples of 8) are"]

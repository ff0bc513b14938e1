"""ChameleonTowerSpec: Chameleon's (model_type "chameleon") image path, a VQ-VAE encoder that turns each image into
discrete codes the text decoder embeds like words (transformers 5.24 models/chameleon/); no projector.

- The config (configuration_chameleon.py `ChameleonConfig`): the decoder's keys flat at the top (hidden 4096, MLP
  11008, 32 layers and heads, vocab 65536, untied); `vq_config` a `ChameleonVQVAEConfig` (class defaults: embed_dim
  256, num_embeddings 8192, latent_channels 256, in_channels 3, base_channels 128, channel_multiplier (1, 1, 2, 2, 4),
  num_res_blocks 2, attn_resolutions None, attn_type "vanilla", double_latent False); `vocabulary_map`, the
  tokenizer's vocabulary, from which `ChameleonImageVocabularyMapping` reads the `<image>` id and the code → token map.
- The model (modeling_chameleon.py `ChameleonModel`): `vqmodel` (`ChameleonVQVAE`: `ChameleonVQVAEEncoder`, the
  `quantize` codebook, `quant_conv` and `post_quant_conv`, 1 × 1 Conv2d) beside the decoder. `get_image_features`
  runs `vqmodel.encode` (encoder → quant_conv → the nearest codebook row by `argmin`), maps each code to its token id
  and embeds those ids with the decoder's own `embed_tokens`; `masked_scatter` puts them in the `<image>` rows. The
  codes are integers, so nothing from the loss reaches the VQ-VAE: its parameters never get a gradient (nor AdamW
  states, torch/optim/adamw.py `_init_group` skips a parameter without one), whatever trains. It has no nn.Linear,
  so peft's "all-linear" adapts nothing in it. `post_quant_conv` is loaded and never run by encode.
- The encoder (`ChameleonVQVAEEncoder`): conv_in (3 × 3, 3 → base), per level i `num_res_blocks` ResnetBlocks
  (GroupNorm(32) → x·sigmoid(x) → 3 × 3 conv → GroupNorm → x·sigmoid(x) → dropout → 3 × 3 conv, a 1 × 1
  `nin_shortcut` where the widths differ) from base · (1, *mult)[i] to base · mult[i] channels, an attention block after
  each at a resolution in attn_resolutions, and a stride-2 3 × 3 `downsample` after every level but the last; then
  `mid` (ResnetBlock, attention block when attn_type is "vanilla", ResnetBlock), GroupNorm, x·sigmoid(x) and conv_out
  (3 × 3 → latent_channels, twice that when double_latent).
- The processor (processing_chameleon.py `ChameleonProcessor`, image_processing_pil_chameleon.py
  `ChameleonImageProcessorPil`, class defaults): every image resized so its shortest edge is 512 and centre-cropped to
  512 × 512, whatever its size: one resolution; `image_seq_length` (1024) `<image>` tokens between a begin and an end
  token per image, and the tokenizer's sep token after each sample's text (`__call__`, unless
  return_for_text_completion). The encoder halves the side at each of its len(mult) − 1 downsamplings (the pad (0, 1,
  0, 1) then the stride-2 3 × 3 convolution keep an even side exactly halved): (512 / 16)² = 1024 codes, the
  processor's image_seq_length, which must agree (`get_placeholder_mask` raises otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpcmem.errors import SpecError
from hpcmem.models.tower_base import TowerBase

# configuration_chameleon.py `ChameleonVQVAEConfig`'s field defaults
CHAMELEON_VQ_DEFAULTS: dict[str, Any] = {
    "embed_dim": 256, "num_embeddings": 8192, "double_latent": False, "latent_channels": 256, "resolution": 512,
    "in_channels": 3, "base_channels": 128, "channel_multiplier": [1, 1, 2, 2, 4], "num_res_blocks": 2,
    "attn_resolutions": None, "dropout": 0.0, "attn_type": "vanilla"}
CHAMELEON_HIDDEN = 4096         # ChameleonConfig.hidden_size
# `ChameleonImageProcessorPil`'s class defaults: the shortest edge resized to 512, the centre 512 × 512 kept
CHAMELEON_CROP = 512
# `ChameleonProcessor.__init__`'s image_seq_length default: `<image>` tokens per image
CHAMELEON_IMAGE_SEQ_LENGTH = 1024
GROUPS = 32                     # every GroupNorm of the encoder (`num_groups=32`)


def _conv(cin: int, cout: int, k: int) -> int:
    """An nn.Conv2d with bias."""
    return cin * cout * k * k + cout


def _resnet(cin: int, cout: int) -> int:
    """ChameleonVQVAEEncoderResnetBlock: norm1, conv1 (3 × 3), norm2, conv2 (3 × 3), nin_shortcut (1 × 1) when the
    widths differ (conv_shortcut is never asked for)."""
    return 2 * cin + _conv(cin, cout, 3) + 2 * cout + _conv(cout, cout, 3) + (_conv(cin, cout, 1) if cin != cout else 0)


def _attn(c: int) -> int:
    """ChameleonVQVAEEncoderAttnBlock: a GroupNorm and four 1 × 1 Conv2d (q, k, v, proj_out)."""
    return 2 * c + 4 * _conv(c, c, 1)


@dataclass(frozen=True, kw_only=True)
class ChameleonLevel:
    """One level of the encoder: its side (pixels of the crop / 2^i), the ResnetBlocks' input and output channels,
    whether an attention block follows each, whether a downsample ends it."""

    side: int
    cin: int
    cout: int
    attention: bool
    downsample: bool


@dataclass(frozen=True, kw_only=True)
class ChameleonTowerSpec(TowerBase):
    """The VQ-VAE (`depth`: levels of the encoder; `hidden_size`: base_channels; `out_hidden_size`: the text width the
    code embeddings have). Nothing in it trains or takes adapters."""

    base_channels: int
    channel_multiplier: tuple[int, ...]
    num_res_blocks: int
    latent_channels: int
    embed_dim: int
    num_embeddings: int
    double_latent: bool
    attn_resolutions: tuple[int, ...]
    attn_type: str
    resolution: int
    crop: int = CHAMELEON_CROP
    image_seq_length: int = CHAMELEON_IMAGE_SEQ_LENGTH
    image_size: int = CHAMELEON_CROP        # hpcmem.job.images: the processor's one square
    fixed_resolution: bool = True
    family: str = "chameleon"
    norm: str = "group"
    mlp: str = ""
    deepstack_visual_indexes: tuple[int, ...] = ()
    hooked_input: bool = False     # ChameleonModel's input embeddings are the decoder's token embeddings

    def levels(self) -> tuple[ChameleonLevel, ...]:
        """`ChameleonVQVAEEncoder.__init__`'s levels at the processor's crop (the resolution attention is decided
        at is the config's `resolution` halved per level, as `curr_res` is)."""
        out, side, res = [], self.crop, self.resolution
        ins = (1, *self.channel_multiplier)
        for i, mult in enumerate(self.channel_multiplier):
            last = i == len(self.channel_multiplier) - 1
            out.append(ChameleonLevel(side=side, cin=self.base_channels * ins[i], cout=self.base_channels * mult,
                                      attention=bool(self.attn_resolutions) and res in self.attn_resolutions
                                      and self.attn_type == "vanilla", downsample=not last))
            if not last:
                side, res = side // 2, res // 2
        return tuple(out)

    @property
    def latent_side(self) -> int:
        """The side of the encoder's output grid: the crop halved at each downsampling."""
        return self.levels()[-1].side

    @property
    def mid_channels(self) -> int:
        return self.base_channels * self.channel_multiplier[-1]

    @property
    def mid_attention(self) -> bool:
        """`mid.attn_1` is an attention block when attn_type is "vanilla", else nn.Identity."""
        return self.attn_type == "vanilla"

    @property
    def image_patches(self) -> int:
        """Codes per image: the latent grid."""
        return self.latent_side ** 2

    @property
    def tokens_per_image(self) -> int:
        return self.image_patches

    def linears(self) -> tuple:
        """No nn.Linear in the VQ-VAE (Conv2d, GroupNorm and the codebook's nn.Embedding only)."""
        return ()

    @property
    def encoder_params(self) -> int:
        """ChameleonVQVAEEncoder's parameters."""
        total = _conv(self.in_channels, self.base_channels, 3)
        for lv in self.levels():
            c = lv.cin
            for _ in range(self.num_res_blocks):
                total += _resnet(c, lv.cout) + (_attn(lv.cout) if lv.attention else 0)
                c = lv.cout
            total += _conv(c, c, 3) if lv.downsample else 0
        c = self.mid_channels
        total += 2 * _resnet(c, c) + (_attn(c) if self.mid_attention else 0)
        return total + 2 * c + _conv(c, 2 * self.latent_channels if self.double_latent else self.latent_channels, 3)

    @property
    def tower_params(self) -> int:
        """The encoder, the codebook (num_embeddings × embed_dim), quant_conv and post_quant_conv."""
        return (self.encoder_params + self.num_embeddings * self.embed_dim
                + _conv(self.latent_channels, self.embed_dim, 1) + _conv(self.embed_dim, self.latent_channels, 1))

    @property
    def block_params(self) -> int:
        return 0

    @property
    def merger_params(self) -> int:
        return 0

    @property
    def num_params(self) -> int:
        return self.tower_params


def _positive(name: str, key: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise SpecError(f"model {name}: vq_config.{key} must be an integer ≥ 1, got {value!r}")
    return value


def chameleon_tower_from_config(cfg: dict[str, Any], name: str) -> ChameleonTowerSpec:
    """The ChameleonTowerSpec of a chameleon config.json dict; vq_config keys it omits take ChameleonVQVAEConfig's
    defaults, the processor its classes' defaults."""
    raw = cfg.get("vq_config")
    if raw is not None and not isinstance(raw, dict):
        raise SpecError(f"model {name}: vq_config must be an object, got {type(raw).__name__}")
    vq = {**CHAMELEON_VQ_DEFAULTS, **(raw or {})}
    for key in ("embed_dim", "num_embeddings", "latent_channels", "resolution", "in_channels", "base_channels",
                "num_res_blocks"):
        _positive(name, key, vq[key])
    mult = vq["channel_multiplier"]
    if not isinstance(mult, (list, tuple)) or not mult or not all(isinstance(m, int) and m >= 1 for m in mult):
        raise SpecError(f"model {name}: vq_config.channel_multiplier must be a list of integers ≥ 1, got {mult!r}")
    for m in (1, *mult):
        if vq["base_channels"] * m % GROUPS:
            # GroupNorm(num_groups=32, num_channels=…) raises unless 32 divides the channels
            raise SpecError(f"model {name}: vq_config.base_channels {vq['base_channels']} × {m} is not divisible by "
                            f"the encoder's {GROUPS} GroupNorm groups")
    attn = vq["attn_resolutions"] or ()
    if vq["attn_type"] not in ("vanilla", None, "none"):
        raise SpecError(f"model {name}: vq_config.attn_type must be \"vanilla\" or none, got {vq['attn_type']!r}")
    if CHAMELEON_CROP % 2 ** (len(mult) - 1):
        raise SpecError(f"model {name}: vq_config.channel_multiplier's {len(mult)} levels halve the processor's "
                        f"{CHAMELEON_CROP} px crop {len(mult) - 1} times, not to a whole side")
    width = cfg.get("hidden_size", CHAMELEON_HIDDEN)
    spec = ChameleonTowerSpec(
        model_type="chameleon", depth=len(mult), hidden_size=vq["base_channels"], intermediate_size=0, num_heads=0,
        in_channels=vq["in_channels"], patch_size=2 ** (len(mult) - 1), out_hidden_size=width, hidden_act="",
        base_channels=vq["base_channels"], channel_multiplier=tuple(mult), num_res_blocks=vq["num_res_blocks"],
        latent_channels=vq["latent_channels"], embed_dim=vq["embed_dim"], num_embeddings=vq["num_embeddings"],
        double_latent=bool(vq["double_latent"]), attn_resolutions=tuple(attn), attn_type=str(vq["attn_type"]),
        resolution=vq["resolution"])
    if spec.image_patches != spec.image_seq_length:
        raise SpecError(f"model {name}: the VQ-VAE makes {spec.image_patches} codes of a {CHAMELEON_CROP} px crop, "
                        f"ChameleonProcessor writes image_seq_length {CHAMELEON_IMAGE_SEQ_LENGTH} <image> tokens: "
                        "get_placeholder_mask raises")
    return spec


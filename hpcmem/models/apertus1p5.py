"""Apertus1p5TowerSpec: Apertus 1.5's (model_type "apertus1p5") image path, a VQ "vision tokenizer" that turns each
image into discrete codes the text embedding then embeds (transformers 5.24 models/apertus1p5/modular_apertus1p5.py,
generated into configuration_apertus1p5.py, modeling_apertus1p5.py, image_processing_apertus1p5.py and
processing_apertus1p5.py).

- The config: `Apertus1p5Config.sub_configs_defaults` builds an omitted `vision_config` as
  `Apertus1p5VisionTokenizerConfig` (codebook 131072, embed_dim 256, latent_channels 256, in_channels 3,
  base_channels 256, channel_multiplier (1, 1, 2, 2, 4), num_res_blocks 4, attn_resolutions (16,), resolution 256),
  the text config as `Apertus1p5TextConfig` (learned, hpcmem.models.vlm_learned) and `audio_config` as a
  `wavtokenizer_encoder` config (WavTokenizer's encoder, which an image batch never runs); image_token_offset maps a
  code to its vocabulary id; tie_word_embeddings False.
- The vision tokenizer (`Apertus1p5VisionTokenizerModel`, kept in fp32: `_keep_in_fp32_modules_strict`): Chameleon's
  VQGAN encoder — conv_in (3 → base, 3 × 3), one stage per channel_multiplier entry of num_res_blocks ResNet blocks
  (GroupNorm(32) → x·sigmoid(x) → conv 3 × 3 → GroupNorm → x·sigmoid(x) → dropout → conv 3 × 3, a 1 × 1 `nin_shortcut`
  where the width changes) each followed by a Chameleon attention block (GroupNorm, q/k/v/proj_out 1 × 1 convolutions)
  at the stages whose resolution (`resolution` / 2^stage) is in attn_resolutions, a stride-2 3 × 3 convolution after
  every stage but the last; the middle (ResNet, attention, ResNet), GroupNorm, x·sigmoid(x), conv_out (→ latent, 3 ×
  3) — then quant_conv (1 × 1 → embed_dim) and the quantizer, an nn.Linear(embed_dim → codebook_size, no bias) whose
  argmax per cell is the code (`Apertus1p5VisionTokenizerVectorQuantizer`). One code per 16 × 16 pixels (2^(stages −
  1)), `Apertus1p5Model.get_image_tokens` adds image_token_offset and embeds them with the text embedding
  (`get_image_features`): nothing in the tower gets a gradient (argmax).
- The processor (`Apertus1p5ImageProcessor`, torchvision only): its own `smart_resize` (factor spatial_factor 16,
  min_pixels 128², max_pixels 1400²), one image at its resized size; `Apertus1p5Processor.replace_image_token` writes
  <boi>, the text "{rows}*{cols}", <image_wrapper>, rows of cols image tokens joined by <eol>, <eoi>.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpcmem.errors import Problems, SpecError
from hpcmem.models.tower_base import TowerBase, TowerLinear, check_counts, fit_pixels, text_width

# configuration_apertus1p5.py `Apertus1p5VisionTokenizerConfig`'s field defaults
APERTUS1P5_VISION_DEFAULTS: dict[str, Any] = {
    "codebook_size": 131072, "embed_dim": 256, "latent_channels": 256, "in_channels": 3, "base_channels": 256,
    "channel_multiplier": [1, 1, 2, 2, 4], "num_res_blocks": 4, "attn_resolutions": [16], "resolution": 256,
    "dropout": 0.0}
# configuration_wavtokenizer_encoder.py `WavTokenizerEncoderConfig`'s field defaults the encoder's parameters follow
WAVTOKENIZER_DEFAULTS: dict[str, Any] = {
    "audio_channels": 1, "num_filters": 32, "upsampling_ratios": [6, 5, 5, 4], "num_residual_layers": 1,
    "compress": 2, "kernel_size": 7, "last_kernel_size": 7, "residual_kernel_size": 3, "num_lstm_layers": 2,
    "hidden_size": 512}
APERTUS1P5_TEXT_HIDDEN = 4096          # `Apertus1p5TextConfig.hidden_size`
APERTUS1P5_PIXELS = (128 * 128, 1400 * 1400)   # `Apertus1p5ImageProcessor.size` (min_pixels, max_pixels)
GROUPS = 32                            # every GroupNorm's num_groups (modeling_chameleon.py)
# the tokens one image writes beside its codes' tokens, before the header: <boi>, <image_wrapper>, <eoi>
# (`Apertus1p5Processor.replace_image_token`), plus one <eol> per code row after the first
WRAPPER_TOKENS = 3


@dataclass(frozen=True, kw_only=True)
class Apertus1p5TowerSpec(TowerBase):
    """The vision tokenizer: `hidden_size` is base_channels, `patch_size` the pixels per code side (2^(stages − 1)),
    `depth` the ResNet blocks of the stages (num_res_blocks per stage)."""

    channel_multiplier: tuple[int, ...]
    num_res_blocks: int
    attn_stages: tuple[int, ...]       # the stages with attention blocks (resolution / 2^stage in attn_resolutions)
    latent_channels: int
    embed_dim: int
    codebook_size: int
    audio_params: int                  # the WavTokenizer encoder's (loaded, never run on images)
    default_pixels: tuple[int, int] = APERTUS1P5_PIXELS
    norm: str = "group"
    mlp: str = "conv"
    family: str = "apertus1p5"
    image_size: int = 0                # no fixed resize: the processor's smart_resize
    temporal_patch_size: int = 1
    fixed_resolution: bool = False
    hooked_input: bool = False         # its codes end the graph (argmax): nothing upstream gets a gradient
    deepstack_visual_indexes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        p = Problems()
        check_counts(p, self, ("hidden_size", "in_channels", "latent_channels", "embed_dim", "codebook_size",
                               "num_res_blocks", "out_hidden_size"))
        p.check(all(isinstance(m, int) and m >= 1 for m in self.channel_multiplier) and self.channel_multiplier,
                f"vision_config.channel_multiplier must be integers ≥ 1, got {self.channel_multiplier!r}")
        p.raise_if_any()
        for c in (*self.widths, self.latent_channels):
            if c % GROUPS and c != self.latent_channels:
                raise SpecError(f"vision_config.base_channels {self.hidden_size}: a stage width {c} is not a "
                                f"multiple of the GroupNorm's {GROUPS} groups")

    @property
    def stages(self) -> int:
        return len(self.channel_multiplier)

    @property
    def widths(self) -> tuple[int, ...]:
        """Each stage's output channels: base_channels · channel_multiplier[stage]."""
        return tuple(self.hidden_size * m for m in self.channel_multiplier)

    def resized(self, height: int, width: int, lo: int | None = None, hi: int | None = None) -> tuple[int, int]:
        """image_processing_apertus1p5.py `smart_resize` at factor patch_size (spatial_factor 16) within [lo, hi]
        pixels (the processor's size)."""
        f = self.patch_size
        lo, hi = lo or self.default_pixels[0], hi or self.default_pixels[1]
        if max(height, width) / min(height, width) > 200:
            raise SpecError(f"image {height}×{width}: Apertus1p5ImageProcessor's smart_resize refuses an aspect ratio "
                            "over 200")
        return fit_pixels(height, width, round(height / f) * f, round(width / f) * f, f, lo, hi)

    def grid(self, height: int, width: int, lo: int | None = None, hi: int | None = None) -> tuple[int, int]:
        """(rows, columns) of codes: the resized sides over patch_size (`replace_image_token`)."""
        h, w = self.resized(height, width, lo, hi)
        return h // self.patch_size, w // self.patch_size

    def image_tokens(self, height: int, width: int, lo: int | None = None, hi: int | None = None) -> int:
        rows, cols = self.grid(height, width, lo, hi)
        return rows * cols

    def linears(self) -> tuple[TowerLinear, ...]:
        """Every nn.Linear (peft's "all-linear" wraps it; the convolutions are not): the quantizer's `embedding`
        (`vision_tokenizer.quantize.embedding`, no bias). WavTokenizer's encoder has none (convolutions, an LSTM)."""
        return (TowerLinear(name="quantize.embedding", in_features=self.embed_dim, out_features=self.codebook_size,
                            count=1, part="merger", bias=False),)

    @staticmethod
    def _conv(cin: int, cout: int, k: int) -> int:
        return cin * cout * k * k + cout

    def resnet_params(self, cin: int, cout: int) -> int:
        """ChameleonVQVAEEncoderResnetBlock: norm1 (2·in), conv1, norm2 (2·out), conv2, a 1 × 1 nin_shortcut when the
        width changes."""
        short = self._conv(cin, cout, 1) if cin != cout else 0
        return 2 * cin + self._conv(cin, cout, 3) + 2 * cout + self._conv(cout, cout, 3) + short

    def attn_params(self, c: int) -> int:
        """ChameleonVQVAEEncoderAttnBlock: GroupNorm and q/k/v/proj_out 1 × 1 convolutions with bias."""
        return 2 * c + 4 * self._conv(c, c, 1)

    @property
    def tower_params(self) -> int:
        """Apertus1p5VisionTokenizerEncoder and quant_conv."""
        total, cin = self._conv(self.in_channels, self.hidden_size, 3), self.hidden_size
        for stage, cout in enumerate(self.widths):
            for _ in range(self.num_res_blocks):
                total += self.resnet_params(cin, cout) + (self.attn_params(cout) if stage in self.attn_stages else 0)
                cin = cout
            if stage < self.stages - 1:
                total += self._conv(cout, cout, 3)
        top = self.widths[-1]
        total += 2 * self.resnet_params(top, top) + self.attn_params(top) + 2 * top
        total += self._conv(top, self.latent_channels, 3) + self._conv(self.latent_channels, self.embed_dim, 1)
        return total

    @property
    def merger_params(self) -> int:
        """The quantizer's codebook Linear."""
        return sum(x.params for x in self.linears())

    @property
    def block_params(self) -> int:
        return 0

    @property
    def num_params(self) -> int:
        """The vision tokenizer's parameters (the audio tokenizer's are `audio_params`)."""
        return self.tower_params + self.merger_params


def wavtokenizer_params(ac: dict[str, Any]) -> int:
    """modeling_wavtokenizer_encoder.py's encoder (EnCodec's SEANet shape, weight-normed convolutions: g [out, 1, 1],
    v and a bias each): conv (channels → num_filters, kernel_size), per ratio of reversed(upsampling_ratios)
    num_residual_layers residual blocks (conv c → c / compress at residual_kernel_size, conv → c at 1, a 1 × 1 shortcut)
    and a stride-ratio conv c → 2c at kernel 2·ratio, the LSTM (num_lstm_layers of 4·c gates over [c, c], two biases),
    and conv (c → hidden_size, last_kernel_size)."""
    def conv(cin: int, cout: int, k: int) -> int:
        return cout + cin * cout * k + cout

    c = ac["num_filters"]
    total = conv(ac["audio_channels"], c, ac["kernel_size"])
    for ratio in reversed(ac["upsampling_ratios"]):
        h = c // ac["compress"]
        total += ac["num_residual_layers"] * (conv(c, h, ac["residual_kernel_size"]) + conv(h, c, 1) + conv(c, c, 1))
        total += conv(c, 2 * c, 2 * ratio)
        c *= 2
    total += ac["num_lstm_layers"] * (4 * c * 2 * c + 2 * 4 * c)
    return total + conv(c, ac["hidden_size"], ac["last_kernel_size"])


def apertus1p5_tower_from_config(cfg: dict[str, Any], name: str) -> Apertus1p5TowerSpec:
    """The Apertus1p5TowerSpec of an apertus1p5 config.json dict; keys it omits take the config classes' defaults."""
    for key in ("vision_config", "audio_config", "text_config"):
        if cfg.get(key) is not None and not isinstance(cfg[key], dict):
            raise SpecError(f"model {name}: {key} must be an object, got {type(cfg[key]).__name__}")
    vc = {**APERTUS1P5_VISION_DEFAULTS, **(cfg.get("vision_config") or {})}
    ac = {**WAVTOKENIZER_DEFAULTS, **(cfg.get("audio_config") or {})}
    mult = tuple(vc["channel_multiplier"])
    res = vc["resolution"]
    attn = tuple(s for s in range(len(mult)) if res // 2 ** s in tuple(vc["attn_resolutions"]))
    if ac.get("model_type", "wavtokenizer_encoder") != "wavtokenizer_encoder":
        raise SpecError(f"model {name}: audio_config.model_type {ac['model_type']!r}: Apertus1p5Config takes "
                        "'wavtokenizer_encoder' only (validate_backbones)")
    return Apertus1p5TowerSpec(
        model_type="apertus1p5", depth=len(mult) * vc["num_res_blocks"], hidden_size=vc["base_channels"],
        intermediate_size=0, num_heads=1, in_channels=vc["in_channels"], patch_size=2 ** (len(mult) - 1),
        out_hidden_size=text_width(cfg, APERTUS1P5_TEXT_HIDDEN), hidden_act="silu", channel_multiplier=mult,
        num_res_blocks=vc["num_res_blocks"], attn_stages=attn, latent_channels=vc["latent_channels"],
        embed_dim=vc["embed_dim"], codebook_size=vc["codebook_size"], audio_params=wavtokenizer_params(ac))

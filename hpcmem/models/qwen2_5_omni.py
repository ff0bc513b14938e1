"""Qwen2.5-Omni's thinker (model_type "qwen2_5_omni_thinker",
Qwen2_5OmniThinkerForConditionalGeneration) with images: Qwen2.5-VL's tower and merger with three q/k/v Linears in
place of the fused qkv (a hpcmem.models.vision_spec VisionSpec of family "qwen2_5_omni"), beside an audio tower that no
image runs (`AudioTower`, the spec's `audio`) (transformers 5.24 models/qwen2_5_omni/modeling_qwen2_5_omni.py).

- The config (configuration_qwen2_5_omni.py `Qwen2_5OmniThinkerConfig.sub_configs_defaults`): an omitted
  vision_config is `Qwen2_5OmniVisionEncoderConfig` (Qwen2_5_VLVisionConfig's fields and defaults: width 3584, MLP
  3420, 32 blocks, 16 heads, silu, patch 14, temporal patch 2, merge 2, window 112, full attention in blocks 7, 15,
  23, 31, merger output 3584), an omitted text_config `Qwen2_5OmniTextConfig` (Qwen2's decoder with M-RoPE:
  `QWEN2_5_OMNI_TEXT_DEFAULTS`), an omitted audio_config `Qwen2_5OmniAudioEncoderConfig`
  (`QWEN2_5_OMNI_AUDIO_DEFAULTS`). The thinker config's tie_word_embeddings (False) decides the head's tying, whatever
  the text config's (True) says (`_tied_weights_keys` of the composite model; measured on the meta model).
- The vision tower (`Qwen2_5OmniVisionEncoder`): Qwen2_5_VisionTransformerPretrainedModel's forward, blocks and
  merger (`Qwen2_5OmniVisionBlock`: RMSNorms, the gated MLP with biases; `Qwen2_5OmniPatchMerger`: ln_q, mlp.0 → GELU
  → mlp.2), except its attention (`Qwen2_5OmniVisionAttention`): `q`, `k`, `v` are three nn.Linear(width → width,
  bias) where Qwen2.5-VL has one `qkv` (the same parameters), then `proj`. So peft "all-linear" wraps attn.q, attn.k
  and attn.v, and v is its own tensor, not a view of a fused output (`fused_qkv`).
- The audio tower (`Qwen2_5OmniAudioEncoder`): conv1 (Conv1d num_mel_bins → d_model, k 3), conv2 (Conv1d d_model →
  d_model, k 3), `audio_bos_eos_token` (Embedding(2, output_dim)), `encoder_layers` Qwen2_5OmniAudioEncoderLayers
  (self_attn.q_proj, k_proj (no bias), v_proj, out_proj of d_model²; self_attn_layer_norm and final_layer_norm
  LayerNorms; fc1 d_model → encoder_ffn_dim, fc2 back), ln_post and `proj` Linear(d_model → output_dim); its
  sinusoidal positions are a non-persistent fp32 buffer [max_source_positions, d_model]
  (`SinusoidsPositionEmbedding`). `Qwen2_5OmniThinkerModel.forward` runs it only on `input_features`, which an
  image-only batch does not carry: its parameters are loaded and get no gradient (no optimizer state: torch's AdamW
  skips parameters whose grad is None), and under LoRA "all-linear" peft wraps its linears too (part "audio":
  adapter weights, no gradient).
- The processor (processing_qwen2_5_omni.py `Qwen2_5OmniProcessor`): Qwen2-VL's image processor
  (image_processing_auto.py: Qwen2VLImageProcessor / Qwen2VLImageProcessorPil), one <|IMAGE|> per merged 2 × 2 patch
  block between <|vision_bos|> and <|vision_eos|> (`replace_image_token`), so image geometry is Qwen2.5-VL's
  (hpcmem.job.images).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpcmem.errors import Problems, SpecError

FP32 = 4
# configuration_qwen2_5_omni.py `Qwen2_5OmniAudioEncoderConfig`'s field defaults that shape its parameters
QWEN2_5_OMNI_AUDIO_DEFAULTS: dict[str, Any] = {
    "num_mel_bins": 128, "encoder_layers": 32, "encoder_attention_heads": 20, "encoder_ffn_dim": 5120,
    "d_model": 1280, "max_source_positions": 1500, "output_dim": 3584}
# its attribute_map: the generic spellings a config.json may carry
AUDIO_ALIASES = {"num_hidden_layers": "encoder_layers", "hidden_size": "d_model",
                 "num_attention_heads": "encoder_attention_heads", "intermediate_size": "encoder_ffn_dim"}
# configuration_qwen2_5_omni.py `Qwen2_5OmniTextConfig`'s field defaults (what a key an omitted or partial text_config
# leaves out takes); its tie_word_embeddings is left out: the thinker config's decides
QWEN2_5_OMNI_TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 152064, "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
    "num_attention_heads": 28, "num_key_value_heads": 4, "hidden_act": "silu", "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6, "use_sliding_window": False, "sliding_window": 32768, "max_window_layers": 28,
    "attention_dropout": 0.0, "rope_theta": 1000000.0}


@dataclass(frozen=True, kw_only=True)
class AudioLinear:
    """One linear of the audio tower: its module name below `audio_tower.` (layers.N.<name>, or `proj`), its shape,
    how many there are, and its bias (k_proj has none)."""

    name: str
    in_features: int
    out_features: int
    count: int
    bias: bool = True
    part: str = "audio"

    @property
    def params(self) -> int:
        return (self.in_features * self.out_features + (self.out_features if self.bias else 0)) * self.count


@dataclass(frozen=True)
class AudioTower:
    """Qwen2_5OmniAudioEncoder's shape."""

    layers: int
    width: int          # d_model
    ffn: int            # encoder_ffn_dim
    heads: int          # encoder_attention_heads
    mel_bins: int
    output_dim: int
    positions: int      # max_source_positions: the sinusoid buffer's rows

    def linears(self) -> tuple[AudioLinear, ...]:
        """`Qwen2_5OmniAudioAttention`'s q/k/v/out_proj (k_proj without bias), `Qwen2_5OmniAudioEncoderLayer`'s fc1
        and fc2 per layer, and the tower's `proj`."""
        d, n = self.width, self.layers
        return (*(AudioLinear(name=f"self_attn.{x}", in_features=d, out_features=d, count=n, bias=x != "k_proj")
                  for x in ("q_proj", "k_proj", "v_proj", "out_proj")),
                AudioLinear(name="fc1", in_features=d, out_features=self.ffn, count=n),
                AudioLinear(name="fc2", in_features=self.ffn, out_features=d, count=n),
                AudioLinear(name="proj", in_features=d, out_features=self.output_dim, count=1))

    @property
    def params(self) -> int:
        """The linears, conv1 and conv2 (kernel 3, with bias), two LayerNorms per layer and ln_post (weight and bias),
        and audio_bos_eos_token (2 rows of output_dim)."""
        d = self.width
        convs = self.mel_bins * d * 3 + d + d * d * 3 + d
        norms = 2 * d * (2 * self.layers + 1)
        return sum(x.params for x in self.linears()) + convs + norms + 2 * self.output_dim

    @property
    def buffer_bytes(self) -> int:
        """`SinusoidsPositionEmbedding.positional_embedding`: fp32 [max_source_positions, d_model], built with
        `.float()` whatever the load dtype."""
        return FP32 * self.positions * self.width


def audio_tower_from_config(cfg: dict[str, Any], name: str) -> AudioTower:
    """The thinker's audio_config over Qwen2_5OmniAudioEncoderConfig's defaults; bad counts are refused."""
    raw = cfg.get("audio_config")
    if raw is not None and not isinstance(raw, dict):
        raise SpecError(f"model {name}: audio_config must be an object, got {type(raw).__name__}")
    ac = {**QWEN2_5_OMNI_AUDIO_DEFAULTS, **{AUDIO_ALIASES.get(k, k): v for k, v in (raw or {}).items()}}
    tower = AudioTower(layers=ac["encoder_layers"], width=ac["d_model"], ffn=ac["encoder_ffn_dim"],
                       heads=ac["encoder_attention_heads"], mel_bins=ac["num_mel_bins"], output_dim=ac["output_dim"],
                       positions=ac["max_source_positions"])
    p = Problems()
    for field, key in (("layers", "encoder_layers"), ("width", "d_model"), ("ffn", "encoder_ffn_dim"),
                       ("heads", "encoder_attention_heads"), ("mel_bins", "num_mel_bins"),
                       ("output_dim", "output_dim"), ("positions", "max_source_positions")):
        value = getattr(tower, field)
        p.check(isinstance(value, int) and not isinstance(value, bool) and value > 0,
                f"model {name}: audio_config.{key} must be a positive integer, got {value!r}")
    p.raise_if_any()
    p.check(tower.width % tower.heads == 0, f"model {name}: audio_config.d_model {tower.width} must be divisible by "
            f"encoder_attention_heads {tower.heads} (Qwen2_5OmniAudioAttention raises otherwise)")
    p.raise_if_any()
    return tower


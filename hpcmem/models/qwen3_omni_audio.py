"""Qwen3-Omni thinker's audio encoder and text config defaults (stdlib): what hpcmem.models.vision puts beside the
image path of a qwen3_omni_moe_thinker (`VisionSpec.audio`), and what it fills an omitted text key with.

transformers 5.24 models/qwen3_omni_moe/modeling_qwen3_omni_moe.py `Qwen3OmniMoeThinkerModel.__init__` builds
`audio_tower` (Qwen3OmniMoeAudioEncoder), `visual` (Qwen3OmniMoeVisionEncoder: Qwen3-VL's tower line for line, its
merger's linears `mlp.0` / `mlp.2`, its deepstack mergers `merger_list.N`) and `language_model`
(Qwen3OmniMoeThinkerTextModel); `Qwen3OmniMoeThinkerForConditionalGeneration` adds an untied `lm_head`
(Qwen3OmniMoeThinkerConfig.tie_word_embeddings False). The audio encoder runs only in `get_audio_features`, on
input_features, which an image-text batch never carries (`Qwen3OmniMoeThinkerModel.forward`: `if input_features is
not None`): with images only its parameters get no gradient and AdamW makes them no state (torch/optim/adamw.py
skips parameters whose grad is None); its weights, its buffer and, under LoRA, the adapters peft puts on its linears
are loaded all the same.

transformers 5.24 models/qwen3_omni_moe/modeling_qwen3_omni_moe.py `Qwen3OmniMoeAudioEncoder.__init__`: three
Conv2d(3 × 3, stride 2, padding 1, with bias) from 1 to downsample_hidden_size channels, `conv_out`
Linear(downsample_hidden_size · ⌈⌈⌈num_mel_bins/2⌉/2⌉/2⌉ → d_model, no bias), encoder_layers
`Qwen3OmniMoeAudioEncoderLayer`s (q/k/v/out_proj d_model → d_model with biases, self_attn_layer_norm, fc1 d_model →
encoder_ffn_dim and fc2 back with biases, final_layer_norm), `ln_post`, `proj1` d_model → d_model and `proj2`
d_model → output_dim with biases, and a sinusoid table buffer (`SinusoidsPositionEmbedding`:
[max_source_positions, d_model], persistent=False).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from hpcmem.errors import Problems, SpecError
from hpcmem.models.tower_base import TowerLinear, check_counts

# configuration_qwen3_omni_moe.py `Qwen3OmniMoeAudioEncoderConfig`'s field defaults (the keys the encoder's modules
# read) and its attribute_map (num_hidden_layers → encoder_layers, hidden_size → d_model, …)
AUDIO_DEFAULTS: dict[str, Any] = {"num_mel_bins": 128, "encoder_layers": 32, "encoder_attention_heads": 20,
                                  "encoder_ffn_dim": 5120, "d_model": 1280, "max_source_positions": 1500,
                                  "output_dim": 3584, "downsample_hidden_size": 480}
AUDIO_ALIASES = {"num_hidden_layers": "encoder_layers", "hidden_size": "d_model",
                 "num_attention_heads": "encoder_attention_heads", "intermediate_size": "encoder_ffn_dim"}
# configuration_qwen3_omni_moe.py `Qwen3OmniMoeTextConfig`'s field defaults, what a key the text_config omits takes
# (no head_dim field: Qwen3OmniMoeThinkerTextAttention reads `getattr(config, "head_dim", hidden // heads)`, so a
# config.json's head_dim holds and an absent one is hidden // heads); tie_word_embeddings is the outer config's
QWEN3_OMNI_TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 3584, "hidden_size": 2048, "intermediate_size": 18944, "num_hidden_layers": 28,
    "num_attention_heads": 28, "num_key_value_heads": 4, "hidden_act": "silu", "max_position_embeddings": 32768,
    "attention_bias": False, "decoder_sparse_step": 1, "moe_intermediate_size": 768, "num_experts_per_tok": 8,
    "num_experts": 128, "norm_topk_prob": True, "mlp_only_layers": None, "head_dim": None}


@dataclass(frozen=True, kw_only=True)
class AudioEncoderSpec:
    """Qwen3OmniMoeAudioEncoder's shape: what its parameters, its buffer and its linears are."""

    encoder_layers: int
    d_model: int
    encoder_attention_heads: int
    encoder_ffn_dim: int
    num_mel_bins: int
    downsample_hidden_size: int
    output_dim: int
    max_source_positions: int

    def __post_init__(self) -> None:
        p = Problems()
        check_counts(p, self, tuple(f.name for f in fields(self)), prefix="audio_config.")
        p.raise_if_any()
        p.check(self.d_model % self.encoder_attention_heads == 0,
                f"audio_config.d_model {self.d_model} is not a multiple of encoder_attention_heads "
                f"{self.encoder_attention_heads} (Qwen3OmniMoeAudioAttention raises)")
        p.check(self.d_model % 2 == 0, f"audio_config.d_model {self.d_model} must be even "
                                       "(SinusoidsPositionEmbedding raises on odd channels)")
        p.raise_if_any()

    @property
    def conv_frequencies(self) -> int:
        """Mel bins left after the three stride-2 convolutions (padding 1): ⌈⌈⌈num_mel_bins/2⌉/2⌉/2⌉, as
        `conv_out`'s in_features spells it (((mel + 1) // 2 + 1) // 2 + 1) // 2."""
        return (((self.num_mel_bins + 1) // 2 + 1) // 2 + 1) // 2

    def linears(self) -> tuple[TowerLinear, ...]:
        """Its nn.Linear layers (part "audio"), named below `audio_tower.`: the layers' self_attn.q/k/v/out_proj and
        fc1/fc2, then conv_out, proj1, proj2."""
        d, f, n = self.d_model, self.encoder_ffn_dim, self.encoder_layers
        return (*(TowerLinear(name=f"self_attn.{x}", in_features=d, out_features=d, count=n, part="audio")
                  for x in ("q_proj", "k_proj", "v_proj", "out_proj")),
                TowerLinear(name="fc1", in_features=d, out_features=f, count=n, part="audio"),
                TowerLinear(name="fc2", in_features=f, out_features=d, count=n, part="audio"),
                TowerLinear(name="conv_out", in_features=self.downsample_hidden_size * self.conv_frequencies,
                            out_features=d, count=1, part="audio", bias=False),
                TowerLinear(name="proj1", in_features=d, out_features=d, count=1, part="audio"),
                TowerLinear(name="proj2", in_features=d, out_features=self.output_dim, count=1, part="audio"))

    @property
    def params(self) -> int:
        """Its linears, two LayerNorms a layer and ln_post (weight and bias), and the three Conv2d's 3 × 3 kernels
        with biases."""
        d, c = self.d_model, self.downsample_hidden_size
        norms = 2 * d * (2 * self.encoder_layers + 1)
        convs = (9 * c + c) + 2 * (9 * c * c + c)
        return sum(x.params for x in self.linears()) + norms + convs

    @property
    def buffer_values(self) -> int:
        """`positional_embedding`'s values ([max_source_positions, d_model]; fp32, hpcmem.estimate's)."""
        return self.max_source_positions * self.d_model

    @property
    def buffer_bytes(self) -> int:
        """The sinusoid table in fp32 (`SinusoidsPositionEmbedding` builds it with `.float()` whatever the load
        dtype)."""
        return 4 * self.buffer_values


def audio_spec_from_config(cfg: dict[str, Any], name: str) -> AudioEncoderSpec:
    """The audio encoder of a qwen3_omni_moe_thinker config.json dict; keys its audio_config omits take
    Qwen3OmniMoeAudioEncoderConfig's defaults."""
    raw = cfg.get("audio_config")
    if raw is not None and not isinstance(raw, dict):
        raise SpecError(f"model {name}: audio_config must be an object, got {type(raw).__name__}")
    values = {**AUDIO_DEFAULTS, **{AUDIO_ALIASES.get(k, k): v for k, v in (raw or {}).items()}}
    return AudioEncoderSpec(**{f.name: values[f.name] for f in fields(AudioEncoderSpec)})

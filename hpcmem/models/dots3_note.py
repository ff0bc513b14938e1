"""Dots3NoteTowerSpec: dots3 Note's (model_type "dots3_note") vision tower and merger, and the audio encoder beside
them that no image runs (transformers 5.24 models/dots3_note/).

- The config (configuration_dots3_note.py): `Dots3NoteConfig.sub_configs_defaults` builds an omitted `vision_config`
  as `Dots3NoteVisionConfig` (width 1536, MLP 4224, 42 layers, 24 heads, 14 px patches, SiLU, merge 2, no biases,
  adapter_in_dim = width, adapter_out_dim 5120 = the text width; `mlp_layer_types` from the released MoE pyramid:
  25 dense layers then 17 of routed experts), an omitted `audio_config` as `Dots3NoteAudioConfig` (width 1280, MLP
  5120, 32 layers, 20 heads, 128 mel bins, a 480-channel conv stem) and an omitted `text_config` as
  `Dots3NoteTextConfig` (MLA / sparse-indexed and sliding attention over routed and shared experts: learned,
  hpcmem.models.vlm_learned).
- The tower (modeling_dots3_note.py `Dots3NoteVisionModel`): `Dots3NoteVisionPatchEmbed` (pixel_values reshaped to
  [-1, 3, 14, 14], a Conv2d with bias, an RMSNorm), the axial 2-D rotary (cos and sin fp32 [N, head_dim]),
  `num_hidden_layers` `Dots3NoteVisionBlock`s (norm1 → `attn.qkv` (no bias) → q_norm / k_norm RMSNorms over the head
  → rotary in fp32 → attention per image over the cu_seqlens chunks → `attn.proj` (no bias); norm2 → the dense
  `Dots3NoteVisionMLP` gate/up/down_proj (no bias)), `norm` (RMSNorm), then `Dots3NoteVisionMerger` (Qwen2-VL's:
  `ln_q` a LayerNorm over the width, a [N / merge², width · merge²] view, `mlp.0` Linear(4·width, 4·width) → GELU →
  `mlp.2` Linear(4·width → adapter_out_dim), both with biases): one image token per merge² patches.
- The image processor: image_processing_auto.py maps dots3_note to Qwen2VLImageProcessor (its PIL twin
  Qwen2VLImageProcessorPil): `smart_resize` on 28 px blocks within min/max_pixels, `patchify` into rows of
  temporal_patch_size · 3 · 14² values. The patch embedding reads rows of 3 · 14² (`reshape(-1, 3, 14, 14)`), so a
  processor with the class default temporal_patch_size 2 hands it twice as many rows as image_grid_thw names and the
  blocks' cu_seqlens split fails: the spec takes temporal_patch_size 1 (what the model can run), and the job's
  processor is built with it (hpcmem.trace.vision_dots3_note).
- The audio encoder (`Dots3NoteAudioModel`, `Dots3NoteModel.audio_tower`): a conv stem (three Conv2d 3×3 with bias,
  `conv_out` Linear(downsample · ceil(mels / 8) → width, no bias)), `num_hidden_layers` layers (q_proj, v_proj, o_proj
  with attention_bias, k_proj without; `mlp.gate_up_proj` Linear(width → 2 · MLP) and `mlp.down_proj`, with biases;
  two RMSNorms), `layer_norm` (RMSNorm) and `adapter` (LayerNorm, fc1 → adapter_out_dim, fc2, with biases), and a
  non-persistent rotary inv_freq pair. `Dots3NoteModel.forward` runs it only on input_features, which an image-text
  batch never has: its parameters load, and under LoRA all-linear its Linears' adapters, with no gradient.

Not modelled: the vision MoE layers (`Dots3NoteVisionMoE`, routed experts at `mlp_layer_types` "sparse"): a config
with any is refused (`dots3_note_tower_from_config`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpcmem.errors import SpecError
from hpcmem.models.tower_base import TowerLinear, text_width, vision_values
from hpcmem.models.vision_spec import VisionSpec

# configuration_dots3_note.py `Dots3NoteVisionConfig`'s field defaults (the dense ones; mlp_layer_types below)
DOTS3_VISION_DEFAULTS: dict[str, Any] = {
    "hidden_size": 1536, "intermediate_size": 4224, "num_hidden_layers": 42, "num_attention_heads": 24,
    "num_channels": 3, "patch_size": 14, "hidden_act": "silu", "spatial_merge_size": 2, "attention_bias": False,
    "mlp_bias": False, "adapter_merge_size": 2, "adapter_out_dim": 5120}
# `Dots3NoteVisionConfig.__post_init__`'s pyramid_num_routed when neither it nor mlp_layer_types is given
DOTS3_VISION_PYRAMID = [-1] * 25 + list(range(4, 65, 4)) + [64]
# configuration_dots3_note.py `Dots3NoteAudioConfig`'s field defaults
DOTS3_AUDIO_DEFAULTS: dict[str, Any] = {
    "hidden_size": 1280, "intermediate_size": 5120, "num_hidden_layers": 32, "num_attention_heads": 20,
    "feature_size": 128, "downsample_hidden_size": 480, "attention_bias": True, "adapter_out_dim": 5120}
DOTS3_TEXT_HIDDEN = 5120    # `Dots3NoteTextConfig.hidden_size`: the text width of an omitted text_config
# the processor's temporal_patch_size the patch embedding can run (the module docstring)
DOTS3_TEMPORAL_PATCH = 1
FP32 = 4


@dataclass(frozen=True, kw_only=True)
class Dots3NoteAudioSpec:
    """The idle audio encoder: its Linears (part "audio": peft wraps them, no image runs them) and the rest."""

    hidden_size: int
    intermediate_size: int
    depth: int
    num_heads: int
    conv_in: int                # conv_out's input: downsample_hidden_size · ceil(feature_size / 8)
    downsample: int
    adapter_out: int
    attention_bias: bool

    def linears(self) -> tuple[TowerLinear, ...]:
        h, i, d, b = self.hidden_size, self.intermediate_size, self.depth, self.attention_bias
        a = "audio_tower.layers.N"
        return (TowerLinear(name=f"{a}.self_attn.q_proj", in_features=h, out_features=h, count=d, part="audio",
                            bias=b),
                TowerLinear(name=f"{a}.self_attn.k_proj", in_features=h, out_features=h, count=d, part="audio",
                            bias=False),
                TowerLinear(name=f"{a}.self_attn.v_proj", in_features=h, out_features=h, count=d, part="audio",
                            bias=b),
                TowerLinear(name=f"{a}.self_attn.o_proj", in_features=h, out_features=h, count=d, part="audio",
                            bias=b),
                TowerLinear(name=f"{a}.mlp.gate_up_proj", in_features=h, out_features=2 * i, count=d, part="audio"),
                TowerLinear(name=f"{a}.mlp.down_proj", in_features=i, out_features=h, count=d, part="audio"),
                TowerLinear(name="audio_tower.conv_stem.conv_out", in_features=self.conv_in, out_features=h,
                            count=1, part="audio", bias=False),
                TowerLinear(name="audio_tower.adapter.fc1", in_features=h, out_features=self.adapter_out, count=1,
                            part="audio"),
                TowerLinear(name="audio_tower.adapter.fc2", in_features=self.adapter_out,
                            out_features=self.adapter_out, count=1, part="audio"))

    @property
    def params(self) -> int:
        """The Linears, the conv stem's three Conv2d (1 → downsample, then downsample → downsample, 3×3, bias), the
        layers' two RMSNorms each, `layer_norm`, the adapter's LayerNorm (weight and bias)."""
        c, h = self.downsample, self.hidden_size
        convs = (9 * c + c) + 2 * (9 * c * c + c)
        return sum(x.params for x in self.linears()) + convs + 2 * h * self.depth + h + 2 * h

    @property
    def buffer_bytes(self) -> int:
        """`Dots3NoteAudioRotaryEmbedding`'s inv_freq and original_inv_freq, fp32 [head_dim · 0.5 / 2] each
        (partial_rotary_factor 0.5, `Dots3NoteAudioConfig.__post_init__`)."""
        return 2 * (int(self.hidden_size // self.num_heads * 0.5) // 2) * FP32


@dataclass(frozen=True, kw_only=True)
class Dots3NoteTowerSpec(VisionSpec):
    """Qwen's tower frame (fused qkv, gated MLP, RMSNorms, the rotary, Qwen2-VL's merger) with dots3 Note's
    differences: q/k norms, no biases in the blocks, a Conv2d patch embedding with bias and an RMSNorm after it,
    a final RMSNorm, the merger's LayerNorm `ln_q`."""

    qk_norm: bool = True
    family: str = "dots3_note"

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def embed_params(self) -> int:
        """patch_embed: the Conv2d (3 · 14² → width, bias) and its RMSNorm."""
        return self.patch_dim * self.hidden_size + 2 * self.hidden_size

    @property
    def block_params(self) -> int:
        """norm1, norm2, qkv and proj without bias, q_norm and k_norm, gate/up/down_proj without bias."""
        h, i = self.hidden_size, self.intermediate_size
        return 2 * h + 3 * h * h + h * h + 2 * self.head_dim + 3 * h * i

    @property
    def tower_params(self) -> int:
        """The patch embedding, the blocks, `norm`."""
        return self.embed_params + self.depth * self.block_params + self.hidden_size

    @property
    def merger_params(self) -> int:
        """ln_q (LayerNorm over the width: weight and bias), mlp.0 and mlp.2 with biases."""
        m = self.merged_width
        return 2 * self.hidden_size + m * m + m + m * self.out_hidden_size + self.out_hidden_size


def _count(value: Any, key: str, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise SpecError(f"model {name}: {key} must be a positive integer, got {value!r}")
    return value


def dense_layers(vc: dict[str, Any], name: str) -> None:
    """Refuses a tower with routed-expert layers (`Dots3NoteVisionBlock` builds `Dots3NoteVisionMoE` at
    mlp_layer_types "sparse"; from pyramid_num_routed: a count > 0); their activations are not modelled."""
    types = vc.get("mlp_layer_types")
    if types is None:
        pyramid = vc.get("pyramid_num_routed", DOTS3_VISION_PYRAMID)
        types = ["sparse" if c > 0 else "dense" for c in pyramid]
    sparse = [i for i, t in enumerate(types) if t != "dense"]
    if sparse:
        raise SpecError(f"model {name}: vision_config.mlp_layer_types has routed-expert layers {sparse[:4]}"
                        f"{'…' if len(sparse) > 4 else ''}: the vision experts' activations are not modelled "
                        "(dense layers only)")
    if len(types) != vc["num_hidden_layers"]:
        raise SpecError(f"model {name}: vision_config.mlp_layer_types has {len(types)} entries, "
                        f"num_hidden_layers {vc['num_hidden_layers']}: one per layer")


def dots3_note_tower_from_config(cfg: dict[str, Any], name: str) -> Dots3NoteTowerSpec:
    """The Dots3NoteTowerSpec of a dots3_note config.json dict; keys it omits take the config classes' defaults."""
    vc = vision_values(cfg, name, DOTS3_VISION_DEFAULTS)
    vc["hidden_size"] = vc.get("embed_dim", vc["hidden_size"])       # `__post_init__`'s legacy aliases
    vc["num_attention_heads"] = vc.get("num_heads", vc["num_attention_heads"])
    vc["attention_bias"] = vc.get("use_bias", vc["attention_bias"])
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "patch_size",
                "spatial_merge_size"):
        _count(vc[key], f"vision_config.{key}", name)
    dense_layers(vc, name)
    if vc["attention_bias"] or vc["mlp_bias"]:
        raise SpecError(f"model {name}: vision_config.attention_bias / mlp_bias must be false (the released tower's; "
                        f"got {vc['attention_bias']!r} / {vc['mlp_bias']!r}): biased blocks are not modelled")
    text = text_width(cfg, DOTS3_TEXT_HIDDEN)
    width_in = vc.get("adapter_in_dim", vc["hidden_size"])
    width_out = vc["adapter_out_dim"]
    if width_in != vc["hidden_size"] or vc["adapter_merge_size"] != vc["spatial_merge_size"] or width_out != text:
        # Dots3NoteVisionConfig / Dots3NoteConfig.validate_architecture raise on each
        raise SpecError(f"model {name}: vision_config.adapter_in_dim {width_in!r}, adapter_merge_size "
                        f"{vc['adapter_merge_size']!r}, adapter_out_dim {width_out!r} must be hidden_size "
                        f"{vc['hidden_size']}, spatial_merge_size {vc['spatial_merge_size']} and the text width {text}")
    return Dots3NoteTowerSpec(
        model_type="dots3_note", depth=vc["num_hidden_layers"], hidden_size=vc["hidden_size"],
        intermediate_size=vc["intermediate_size"], num_heads=vc["num_attention_heads"], in_channels=3,
        patch_size=vc["patch_size"], spatial_merge_size=vc["spatial_merge_size"],
        temporal_patch_size=DOTS3_TEMPORAL_PATCH, window_size=0, out_hidden_size=text, fullatt_block_indexes=(),
        hidden_act=str(vc["hidden_act"]), norm="rms", mlp="gated", patch_bias=True, hooked_input=True,
        audio=_audio(cfg, name, text))


def _audio(cfg: dict[str, Any], name: str, text: int) -> Dots3NoteAudioSpec:
    raw = cfg.get("audio_config")
    if raw is not None and not isinstance(raw, dict):
        raise SpecError(f"model {name}: audio_config must be an object, got {type(raw).__name__}")
    ac = {**DOTS3_AUDIO_DEFAULTS, **(raw or {})}
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "feature_size",
                "downsample_hidden_size", "adapter_out_dim"):
        _count(ac[key], f"audio_config.{key}", name)
    if ac["adapter_out_dim"] != text:
        # Dots3NoteConfig.validate_architecture raises on it
        raise SpecError(f"model {name}: audio_config.adapter_out_dim {ac['adapter_out_dim']!r} must be the text width "
                        f"{text} (Dots3NoteConfig refuses it)")
    if ac.get("whisper_config"):
        raise SpecError(f"model {name}: audio_config.whisper_config (a legacy layout) is not read; give the "
                        "Dots3NoteAudioConfig fields")
    return Dots3NoteAudioSpec(hidden_size=ac["hidden_size"], intermediate_size=ac["intermediate_size"],
                              depth=ac["num_hidden_layers"], num_heads=ac["num_attention_heads"],
                              conv_in=ac["downsample_hidden_size"] * ((ac["feature_size"] + 7) // 8),
                              downsample=ac["downsample_hidden_size"], adapter_out=ac["adapter_out_dim"],
                              attention_bias=bool(ac["attention_bias"]))

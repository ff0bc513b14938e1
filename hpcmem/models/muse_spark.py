"""MuseSparkTowerSpec: Muse Spark's (model_type "muse_spark") image path — Muse Glimmer's tower, vision adapter and
projection (hpcmem.models.muse_glimmer) — and its audio tower, which loads but never runs on an image-text job
(transformers 5.24 models/muse_spark/).

- The config (configuration_muse_spark.py): `MuseSparkConfig(MuseGlimmerConfig)`'s `sub_configs_defaults` build an
  omitted `vision_config` as `MuseSparkVisionConfig` (MuseGlimmerVisionConfig's fields and defaults), an omitted
  `text_config` as `MuseSparkTextConfig` (width 8192, an MoE decoder of DeepSeek-V3's experts under MiniMax-M2's
  router: learned, hpcmem.models.vlm_learned) and an omitted `audio_config` as `MuseSparkAudioConfig` (a causal
  convolution pyramid: patch_sizes (16, 6, 5, 4), hidden_sizes (256, 512, 1024, 2048), depths (2, 2, 2, 2),
  mlp_ratio 4, kernel 7, out_hidden_size 8192); out_hidden_size 6144, projector_hidden_size 4096, GELU.
- The image path (modular_muse_spark.py): `MuseSparkModel(MuseGlimmerModel)` builds `vision_tower` with
  `AutoModel.from_config(vision_config)` (`MuseSparkVisionModel(MuseGlimmerVisionModel)`) and keeps Muse Glimmer's
  vision_adapter, vision_projection and perception_emb_norm and its `get_image_features`; the image processor is
  Muse Glimmer's (auto/image_processing_auto.py maps muse_spark to MuseGlimmerImageProcessor), the processor
  `MuseSparkProcessor(MuseGlimmerProcessor)`.
- The audio tower (`MuseSparkAudioModel`, `MuseSparkModel.audio_tower`): per stage a patch embedding (Linear(in ·
  patch → hidden, bias) and a weighted RMSNorm), `depths` conv blocks (a depthwise causal Conv1d with bias, a
  weighted RMSNorm, CLIPMLP fc1 → GELU → fc2 with biases), then `norm`, `proj` (→ out_hidden_size, bias) and
  `post_proj_norm`. `MuseSparkModel.forward` runs it only on input_values, which an image-text job has none of: its
  parameters load (and, under LoRA all-linear, its Linears' adapters), and get no gradient and no optimizer state.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from hpcmem.errors import SpecError
from hpcmem.models.muse_glimmer import MuseGlimmerTowerSpec, muse_glimmer_tower_from_config
from hpcmem.models.tower_base import TowerLinear

# configuration_muse_spark.py `MuseSparkAudioConfig`'s field defaults
MUSE_SPARK_AUDIO_DEFAULTS: dict[str, Any] = {
    "patch_sizes": (16, 6, 5, 4), "hidden_sizes": (256, 512, 1024, 2048), "depths": (2, 2, 2, 2),
    "mlp_ratio": 4.0, "conv_kernel_size": 7, "out_hidden_size": 8192}
MUSE_SPARK_TEXT_HIDDEN = 8192       # `MuseSparkTextConfig.hidden_size`: the text width of an omitted text_config


@dataclass(frozen=True, kw_only=True)
class MuseSparkTowerSpec(MuseGlimmerTowerSpec):
    """Muse Glimmer's image path and the idle audio tower (`audio_linears`, `audio_other`: its Linears and the rest of
    its parameters)."""

    audio_linears: tuple[TowerLinear, ...]
    audio_other: int

    def linears(self) -> tuple[TowerLinear, ...]:
        """Muse Glimmer's and the audio tower's (`audio_tower.…`, part "idle": peft's all-linear wraps them too; no
        image runs them, so their adapters get no gradient: hpcmem.estimate.vision `tower_states`)."""
        return (*super().linears(), *self.audio_linears)

    @property
    def merger_params(self) -> int:
        return sum(x.params for x in self.linears() if x.part == "merger")

    @property
    def audio_params(self) -> int:
        return sum(x.params for x in self.audio_linears) + self.audio_other

    @property
    def idle_params(self) -> int:
        """Parameters no image-text step reaches: the audio tower's."""
        return self.audio_params

    @property
    def num_params(self) -> int:
        return self.tower_params + self.merger_params + self.audio_params


def audio_parts(ac: dict[str, Any], name: str) -> tuple[tuple[TowerLinear, ...], int]:
    """(the Linears, the other parameters) of `MuseSparkAudioModel` at audio config `ac` (modular_muse_spark.py
    `MuseSparkAudioPatchEmbedding`, `MuseSparkAudioConvBlock`, `MuseSparkAudioMLP`: int(hidden · mlp_ratio) wide)."""
    patches, widths, depths = (list(ac[k]) for k in ("patch_sizes", "hidden_sizes", "depths"))
    if not len(patches) == len(widths) == len(depths):
        raise SpecError(f"model {name}: audio_config patch_sizes, hidden_sizes and depths must have one entry per "
                        f"layer, got {len(patches)}, {len(widths)} and {len(depths)}")
    linears: list[TowerLinear] = []
    other = 0
    previous = 1            # layer 0 reads the mono waveform
    for i, (patch, h, depth) in enumerate(zip(patches, widths, depths, strict=True)):
        inner = int(h * ac["mlp_ratio"])
        linears.append(TowerLinear(name=f"audio_tower.layers.{i}.patch_embedder.proj", in_features=previous * patch,
                                   out_features=h, count=1, part="idle"))
        other += h                                              # the patch embedding's RMSNorm
        for b in range(depth):
            prefix = f"audio_tower.layers.{i}.conv_blocks.{b}.mlp"
            linears += [TowerLinear(name=f"{prefix}.fc1", in_features=h, out_features=inner, count=1, part="idle"),
                        TowerLinear(name=f"{prefix}.fc2", in_features=inner, out_features=h, count=1, part="idle")]
            other += h * ac["conv_kernel_size"] + h + h         # the depthwise Conv1d (weight, bias), its RMSNorm
        previous = h
    out = ac["out_hidden_size"]
    linears.append(TowerLinear(name="audio_tower.proj", in_features=previous, out_features=out, count=1,
                               part="idle"))
    return tuple(linears), other + previous + out               # `norm`, `post_proj_norm`


def muse_spark_tower_from_config(cfg: dict[str, Any], name: str) -> MuseSparkTowerSpec:
    """The MuseSparkTowerSpec of a muse_spark config.json dict: Muse Glimmer's reading of the vision part (the text
    width MuseSparkTextConfig's when omitted), the audio config over MuseSparkAudioConfig's defaults."""
    raw = cfg.get("audio_config")
    if raw is not None and not isinstance(raw, dict):
        raise SpecError(f"model {name}: audio_config must be an object, got {type(raw).__name__}")
    ac = {**MUSE_SPARK_AUDIO_DEFAULTS, **(raw or {})}
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {}
    text_hidden = text.get("hidden_size", MUSE_SPARK_TEXT_HIDDEN)
    if ac["out_hidden_size"] != text_hidden:
        # MuseSparkConfig.validate_architecture raises on it
        raise SpecError(f"model {name}: audio_config.out_hidden_size {ac['out_hidden_size']!r} must be the text width "
                        f"{text_hidden!r} (MuseSparkConfig refuses it)")
    glimmer = muse_glimmer_tower_from_config({**cfg, "text_config": {**text, "hidden_size": text_hidden}}, name)
    linears, other = audio_parts(ac, name)
    kept = {f.name: getattr(glimmer, f.name) for f in fields(glimmer) if f.name != "model_type"}
    return MuseSparkTowerSpec(**kept, model_type="muse_spark", audio_linears=linears, audio_other=other)

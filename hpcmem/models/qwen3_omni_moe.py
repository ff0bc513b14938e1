"""Qwen3-Omni's thinker (qwen3_omni_moe_thinker) with images: Qwen3-VL's tower beside an audio encoder no image runs.

transformers 5.24 models/qwen3_omni_moe/modeling_qwen3_omni_moe.py `Qwen3OmniMoeThinkerModel.__init__` builds
`audio_tower` (Qwen3OmniMoeAudioEncoder), `visual` (Qwen3OmniMoeVisionEncoder) and `language_model`
(Qwen3OmniMoeThinkerTextModel); `Qwen3OmniMoeThinkerForConditionalGeneration` adds an untied `lm_head`
(Qwen3OmniMoeThinkerConfig.tie_word_embeddings False).

- The vision encoder is Qwen3-VL's tower line for line (`Qwen3OmniMoeVisionBlock`: LayerNorms, fused qkv and proj with
  biases, linear_fc1 → gelu_pytorch_tanh → linear_fc2; a Conv3d patch embedding with bias, a learned position table
  resampled per image, 2-D rotary; Qwen3OmniMoeVisionEncoderConfig's defaults are Qwen3VLVisionConfig's), except the
  names of its mergers: `Qwen3OmniMoeVisionPatchMerger` keeps `ln_q` and `mlp`, an nn.ModuleList of Linear → nn.GELU
  → Linear (so its linears are `mlp.0` and `mlp.2`), and the deepstack mergers are `merger_list.N`
  (`deepstack_merger_list` a property returning it). hpcmem.models.vision's qwen3_vl layout with those merger names.
- The audio encoder (hpcmem.models.qwen3_omni_audio `AudioEncoderSpec`) runs only in `get_audio_features`, on
  input_features, which an image-text batch never carries (`Qwen3OmniMoeThinkerModel.forward`: `if input_features is
  not None`): with images only its parameters get no gradient and AdamW makes them no state (torch/optim/adamw.py
  skips parameters whose grad is None); its weights, its buffer and, under LoRA, the adapters peft puts on its
  linears are loaded all the same.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from hpcmem.models.qwen3_omni_audio import AudioEncoderSpec, audio_spec_from_config
from hpcmem.models.vision import VisionSpec


@dataclass(frozen=True, kw_only=True)
class Qwen3OmniThinkerSpec(VisionSpec):
    """Qwen3-VL's tower, merger and deepstack mergers (VisionSpec, the qwen3_vl layout with `mlp.0` / `mlp.2`
    merger linears) and the idle audio encoder beside them."""

    audio: AudioEncoderSpec

    def linears(self) -> tuple[Any, ...]:
        """The image path's linears (VisionSpec's), then the audio encoder's (part "audio": peft wraps those its
        targets reach, and their adapters get no gradient)."""
        return (*super().linears(), *self.audio.linears())

    @property
    def image_path(self) -> VisionSpec:
        """The tower, merger and deepstack mergers alone, what an image runs through."""
        return VisionSpec(**{f.name: getattr(self, f.name) for f in fields(VisionSpec) if f.init})

    @property
    def idle_params(self) -> int:
        """The audio encoder's parameters: loaded, never run on images."""
        return self.audio.params

    @property
    def num_params(self) -> int:
        return self.tower_params + self.merger_params + self.deepstack_params + self.idle_params


def thinker_spec(image_path: VisionSpec, cfg: dict[str, Any], name: str) -> Qwen3OmniThinkerSpec:
    """The thinker's spec: `image_path` (hpcmem.models.vision's qwen3_omni_moe_thinker layout) with its audio
    encoder."""
    return Qwen3OmniThinkerSpec(**{f.name: getattr(image_path, f.name) for f in fields(VisionSpec) if f.init},
                                audio=audio_spec_from_config(cfg, name))

"""Qwen3-Omni thinker's image path and idle audio encoder in a vision-language job (hpcmem.models.qwen3_omni_audio), as
hpcmem.estimate.vision's `VisionTerms`.

How the step runs (transformers 5.24 models/qwen3_omni_moe/modeling_qwen3_omni_moe.py
`Qwen3OmniMoeThinkerModel.forward`): `get_image_features` runs `Qwen3OmniMoeVisionEncoder` on pixel_values cast to
the tower's dtype — Qwen3VLVisionModel's forward line for line: patch embedding, resampled position table, 2-D rotary,
the blocks, a deepstack merger after each block of deepstack_visual_indexes, the merger — splits the merger's and the
deepstack mergers' outputs per image, scatters the first into the token embeddings (`masked_scatter`) and hands the
others to the language model, which adds them to the image tokens' rows after its first layers
(`Qwen3OmniMoeThinkerTextModel._deepstack_process`), and returns the vision outputs with its own
(`image_outputs`), as Qwen3VLModel.forward does. So the image path's terms are Qwen3-VL's
(hpcmem.estimate.vision `vision_terms` on the spec's `image_path`: its mergers' linears, `mlp.0` / `mlp.2`, are
Qwen3-VL's linear_fc1 / linear_fc2 by another name).

The audio encoder runs only on input_features (`if input_features is not None`), which an image-text batch never
has: its parameters and its fp32 sinusoid buffer are loaded and nothing else — no gradient, so no optimizer state
(torch/optim/adamw.py `_init_group` skips a parameter whose grad is None), no activation. Under LoRA the adapters
peft puts on its linears (those the targets reach) are loaded in the adapters' dtype and get no gradient either.
"""

from __future__ import annotations

from dataclasses import replace

from hpcmem.estimate.lora import LoraLayout
from hpcmem.estimate.vision import FP32, VisionTerms, vision_adapters, vision_terms
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import Precision
from hpcmem.models.vision import VisionSpec


def qwen3_omni_terms(job: JobSpec, prec: Precision, lora: LoraLayout) -> VisionTerms | None:
    """The image path's terms (Qwen3-VL's) with the idle audio encoder's weights, buffer and adapters added to the
    tower's weights."""
    v: VisionSpec = job.model.vision
    terms = vision_terms(replace(job, model=replace(job.model, vision=v.image_path)), prec, lora)
    if terms is None:
        return None
    audio = [x for x in vision_adapters(job, v) if x.part == "audio"] if lora.enabled else []
    adapters = sum(job.train.lora_r * (x.in_features + x.out_features) * x.count for x in audio)
    idle = v.audio.params * prec.weight + v.audio.buffer_values * FP32 + adapters * lora.adapter_bytes
    reached = f", LoRA on {len(audio)} of its linear kinds" if audio else ""
    return replace(terms, weights=terms.weights + idle,
                   trained=f"{terms.trained}; the audio encoder loaded and idle (no gradient{reached})")

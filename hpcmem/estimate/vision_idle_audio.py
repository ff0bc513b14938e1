"""An Omni thinker's image path and the audio encoder beside it that no image runs (`VisionSpec.audio`), as
hpcmem.estimate.vision's `VisionTerms`: the image path's terms, plus the audio encoder's weights, its fp32 sinusoid
buffer and, under LoRA, the adapters peft puts on its linears.

How the step runs (transformers 5.24): `Qwen3OmniMoeThinkerModel.forward` (models/qwen3_omni_moe/
modeling_qwen3_omni_moe.py) runs `get_image_features` — `Qwen3OmniMoeVisionEncoder`, Qwen3VLVisionModel's forward line
for line: patch embedding, resampled position table, 2-D rotary, the blocks, a deepstack merger after each block of
deepstack_visual_indexes, the merger — scatters the merger's output into the token embeddings (`masked_scatter`) and
hands the deepstack outputs to the language model, as Qwen3VLModel.forward does; `Qwen2_5OmniThinkerModel.forward`
(models/qwen2_5_omni/modeling_qwen2_5_omni.py) runs `self.visual`, Qwen2.5-VL's forward with three q/k/v Linears,
as Qwen2_5_VLModel.forward does. So the image path's terms are the Qwen towers' (hpcmem.estimate.vision
`vision_terms` on the spec's `image_path`).

Both run their audio encoder only on input_features (`get_audio_features`), which an image-text batch never has: its
parameters and its buffer are loaded and nothing else — no gradient, so no optimizer state (torch/optim/adamw.py
`_init_group` skips a parameter whose grad is None), no activation. Under LoRA "all-linear" peft wraps its linears too
(peft tuners_utils.py `_maybe_include_all_linear_layers`): those adapters are loaded in the adapters' dtype and get
no gradient either.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hpcmem.estimate.lora import LoraLayout
from hpcmem.estimate.vision import VisionTerms, vision_adapters, vision_terms
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import Precision
from hpcmem.models.vision_spec import VisionSpec


def idle_audio_terms(job: JobSpec, prec: Precision, lora: LoraLayout, outside: Any = None) -> VisionTerms | None:
    """The image path's terms (the Qwen towers'; `outside`: `vision_terms`' own for a tower whose parts outside its
    blocks differ, dots3 Note's) with the idle audio encoder's weights, buffer and adapters added to the tower's
    weights."""
    v: VisionSpec = job.model.vision
    terms = vision_terms(replace(job, model=replace(job.model, vision=v.image_path)), prec, lora, outside=outside)
    if terms is None:
        return None
    audio = [x for x in vision_adapters(job, v) if x.part == "audio"] if lora.enabled else []
    adapters = sum(job.train.lora_r * (x.in_features + x.out_features) * x.count for x in audio)
    idle = v.audio.params * prec.weight + v.audio.buffer_bytes + adapters * lora.adapter_bytes
    reached = f", LoRA on {len(audio)} of its linear kinds" if audio else ""
    return replace(terms, weights=terms.weights + idle,
                   trained=f"{terms.trained}; the audio encoder loaded and idle (no gradient{reached})")

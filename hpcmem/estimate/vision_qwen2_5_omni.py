"""Qwen2.5-Omni's thinker with images: the Qwen towers' terms (hpcmem.estimate.vision `vision_terms`, its blocks'
attention as three q/k/v Linears, `block_spec`) less what the audio tower, which no image runs, would have trained.

How the step runs (transformers 5.24 models/qwen2_5_omni/modeling_qwen2_5_omni.py): `Qwen2_5OmniThinkerModel.forward`
runs `get_image_features` (`self.visual`, Qwen2.5-VL's forward) on pixel_values and scatters the merger's output into
the image tokens' embeddings, as Qwen2_5_VLModel.forward does; it runs `get_audio_features` (`self.audio_tower`) only
on `input_features`, which an image batch does not carry. So the audio tower's parameters are loaded (`VisionSpec.
idle_params`, in the weights' dtype) and so is its sinusoid buffer (fp32 [max_source_positions, d_model],
`SinusoidsPositionEmbedding`, which the load dtype does not cast: `AudioTower.buffer_bytes`), but none of them gets a
gradient: full fine-tuning makes no gradient and no AdamW state for them (torch/optim/adamw.py `_init_group` skips a
parameter whose grad is None), and under LoRA "all-linear" peft wraps the audio linears too (peft tuners_utils.py
`_maybe_include_all_linear_layers`), whose adapters are loaded in the adapters' dtype and likewise get neither.
"""

from __future__ import annotations

from dataclasses import replace

from hpcmem.estimate.lora import LoraLayout
from hpcmem.estimate.states import optimizer_bytes_per_param
from hpcmem.estimate.vision import VisionTerms, vision_adapters, vision_terms
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import Precision


def qwen2_5_omni_terms(job: JobSpec, prec: Precision, lora: LoraLayout) -> VisionTerms | None:
    """`vision_terms` with the audio tower's buffer in the weights and its parameters (or its adapters) out of the
    gradients and the optimizer states."""
    terms = vision_terms(job, prec, lora)
    v = job.model.vision
    if terms is None or v.audio is None:
        return terms
    weights = terms.weights + v.audio.buffer_bytes
    if not terms.gradients:         # no images, or a tower with no graph: nothing trains in it
        return replace(terms, weights=weights, trained=terms.trained + "; the audio tower loaded and idle")
    r, trained = job.train.lora_r, not lora.enabled
    gbytes = prec.weight if trained else lora.adapter_bytes
    if trained:
        trainable = v.num_params - v.idle_params
    else:
        trainable = sum(r * (x.in_features + x.out_features) * x.count for x in vision_adapters(job, v)
                        if x.part != "audio")
    return replace(terms, weights=weights, gradients=trainable * gbytes,
                   optimizer=int(trainable * optimizer_bytes_per_param(job.train.optim, gbytes)),
                   trained=terms.trained + "; the audio tower loaded and idle (no gradient)")

"""Inkling's hierarchical-MLP tower in a vision-language job (hpcmem.models.inkling), as hpcmem.estimate.vision's
`VisionTerms`, which `with_vision` places in the learned text part's phases (hpcmem.models.vlm_learned).

How the step runs (transformers 5.24 models/inkling/modeling_inkling.py `InklingModel.get_image_features`,
`InklingVisionModel.forward`): pixel_values [N, 2, 40, 40, 3] fp32 (one row per patch and image token) go straight
into the layers. Layer k (`InklingVisionEncoderLayer.forward`) on R_k = N · positions_k rows (the patch's
t · h · w positions left after its fold):
- `fold_timespace_to_depth` where it folds: reshape, permute, reshape — a copy [R_k, in_k] in its input's dtype
  (the previous layer's GELU output is then freed);
- `projection` (nn.Linear without bias) under autocast: a 16-bit copy of an fp32 input (layer 0's pixel rows), kept
  with the weights' own input for the weight gradient when it trains; under LoRA its adapter keeps its own (peft's
  dropout records no mask on layer 0, whose input requires no grad: hpcmem.estimate.vision_cosmos3_edge alike);
- in all but the last layer `InklingRMSNorm` (`hidden_states.to(torch.float32)`, kept by `pow` and by the `* rsqrt`
  product with the fp32 rsqrt [R_k, 1]; `self.weight * hidden_states.to(input_dtype)` keeps the 16-bit normalised
  rows when the weight trains) and `F.gelu`, which keeps its input, the product [R_k, out_k].
The layers are plain nn.Modules, not GradientCheckpointingLayers: checkpointing recomputes none of them. After the
last: `final_norm` (an RMSNorm of the text width, the same saved tensors) on [N, text]; its output, reshaped, is
`pooler_output`, cast to the token embeddings' dtype (no copy in 16-bit) for `masked_scatter` and returned in the
model's output (`image_outputs`) until the trainer drops it: a forward-only local.

Trained or frozen is what TRL and peft do: full fine-tuning trains every projection and norm; LoRA all-linear adapts
every projection (peft tuners_utils.py `_maybe_include_all_linear_layers`). The audio tower (`InklingAudioModel`:
an embedding, a norm, no Linear) never runs on an image-text batch: its weights and its int64 buffer, no gradient,
no optimizer state (torch/optim/adamw.py `_init_group` skips a parameter whose grad is None). InklingVisionModel
names no input embeddings, so under checkpointing with PEFT only the token embeddings' output is hooked
(`enable_input_require_grads`). Under LoRA without checkpointing the adapted tower's features make the first decoder
layer's input require grad: hpcmem.estimate.vision_inkling_text.
"""

from __future__ import annotations

from dataclasses import replace

from hpcmem.estimate.lora import LoraLayout, backward_bytes_per_input
from hpcmem.estimate.states import optimizer_bytes_per_param
from hpcmem.estimate.vision import (FP32, VisionTerms, adapters_saved, graphless_tower, token_leaf, tower_weights,
                                    unused_tower)
from hpcmem.estimate.vision_inkling_text import first_layer_input
from hpcmem.job.image_rules import image_rows
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import Precision
from hpcmem.models.inkling import HmlpLayer, InklingTowerSpec


def rms_norm_saved(width: int, prec: Precision, trained: bool) -> int:
    """Bytes per row `InklingRMSNorm.forward` keeps: the fp32 copy of its input, the fp32 rsqrt, and the 16-bit
    normalised rows the weight's product keeps when the weight trains."""
    return FP32 * width + FP32 + (prec.act * width if trained else 0)


def layer_saved(x: HmlpLayer, k: int, rows: int, prec: Precision, trained: bool, adapter: list,
                lora: LoraLayout) -> int:
    """What layer k keeps on `rows` rows (the module docstring): the projection's 16-bit input when it trains, its
    adapter's own (no dropout mask on layer 0), the norm's and GELU's input in all but the last layer."""
    lin = prec.act * x.in_features * rows if trained else 0
    own = adapters_saved(adapter, rows, prec, lora if k else replace(lora, dropout=False))
    tail = (rms_norm_saved(x.out_features, prec, trained) + prec.act * x.out_features) * rows if x.norm else 0
    return lin + own + tail


def layer_backward(x: HmlpLayer, k: int, rows: int, prec: Precision, adapter: list, lora: LoraLayout) -> int:
    """Layer k's backward temporaries beside its saved tensors: the gradient of its output (16-bit), through GELU and
    the norm (the fp32 gradients of the copy and the product), and of its input (16-bit; none for layer 0, whose
    pixel rows require none) with the fold's permuted copy; an adapter's own (hpcmem.estimate.lora
    `backward_bytes_per_input`)."""
    out = prec.act * x.out_features * (1 + (1 + 2 * FP32 // prec.act if x.norm else 0))
    into = prec.act * x.in_features * (2 if x.folds else 1) if k else 0
    adapt = x.in_features * backward_bytes_per_input(lora) if adapter else 0
    return (out + into + adapt) * rows


def inkling_terms(job: JobSpec, prec: Precision, lora: LoraLayout) -> VisionTerms:
    v: InklingTowerSpec = job.model.vision
    images, n = image_rows(job)
    adapted, _, weights = tower_weights(job, v, prec, lora)
    weights += v.audio_buffer_bytes
    if images == 0:
        return unused_tower(weights)
    trained, gc = not lora.enabled, job.train.gradient_checkpointing
    pixels = n * v.patch_dim * FP32
    text = v.out_hidden_size
    leaves = token_leaf(job, prec) if not trained and gc else 0
    if lora.enabled and not adapted:
        return graphless_tower(weights=weights, pixels=pixels, patches=n, image_tokens=n, saved=leaves,
                               why="no adapter in the tower")
    layers = v.layers()
    by_name = {x.name: x for x in adapted}
    adapters = [[by_name[f"encoder_layers.{k}.projection"]] if f"encoder_layers.{k}.projection" in by_name else []
                for k in range(len(layers))]
    rows = [n * x.positions for x in layers]
    blocks = tuple(layer_saved(x, k, r, prec, trained, a, lora)
                   for k, (x, r, a) in enumerate(zip(layers, rows, adapters)))
    backward = tuple(layer_backward(x, k, r, prec, a, lora)
                     for k, (x, r, a) in enumerate(zip(layers, rows, adapters)))
    final = rms_norm_saved(text, prec, trained) * n
    gbytes = prec.weight if trained else lora.adapter_bytes
    r_ = job.train.lora_r
    per_layer = tuple((x.in_features * x.out_features + (x.out_features if x.norm else 0)) if trained else
                      sum(r_ * (a.in_features + a.out_features) for a in ad) for x, ad in zip(layers, adapters))
    merger_params = text if trained else 0
    trainable = sum(per_layer) + merger_params
    what = ("tower trained (full fine-tuning)" if trained else
            f"frozen; LoRA on {len(adapted)} of its {len(layers)} projections") + \
        "; the audio tower loaded and idle (no gradient)"
    return VisionTerms(weights=weights, gradients=trainable * gbytes,
                       optimizer=int(trainable * optimizer_bytes_per_param(job.train.optim, gbytes)),
                       pixels=pixels, saved=sum(blocks) + final + leaves, merger_saved=final, blocks_saved=blocks,
                       block_full=0, block_backward=max(backward), block_grads=0, merger_grads=merger_params * gbytes,
                       patches=n, image_tokens=n, trained=what, forward_only=prec.act * text * n, recomputes=False,
                       blocks_backward=backward, blocks_grads=tuple(p * gbytes for p in per_layer),
                       text_saved=first_layer_input(job, prec, lora, adapted))

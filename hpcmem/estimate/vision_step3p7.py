"""Step 3.7 Flash's tower, downsampler and projector in a vision-language job (hpcmem.models.step3p7), as
hpcmem.estimate.vision's `VisionTerms`, which `with_vision` places in the learned text part's phases
(hpcmem.models.vlm_learned).

How the step runs (transformers 5.24 models/step3p7/modeling_step3p7.py `Step3p7Model.get_image_features`,
`Step3p7VisionModel.forward`): the tower runs twice, on the global views (pixel_values [images, 3, 728, 728]) and on
the local crops (pixel_values_local [crops, 3, 504, 504], when any image has crops); each pass:
`Step3p7VisionEmbeddings` (SiglipVisionEmbeddings.forward: pixel_values cast to the weights' dtype, which the Conv2d
keeps when it trains; the position table added, bilinearly resampled for a crop's grid: `interpolate`'s backward keeps
no tensor) → `pre_layernorm` (its input and stats kept; its output feeds the residual, not a linear) → the axial
rope's fp32 cos and sin [seq, head_dim] (`Step3p7VisionRotaryEmbedding`, once per pass, kept by every layer's
`q * cos`, `rotate_half(q) * sin` in `apply_rotary_pos_emb_vision`) → the layers (`Step3p7VisionEncoderLayer`, a
GradientCheckpointingLayer: under checkpointing its input alone; else layernorm_before, q/k/v_proj, the rope in fp32
cast back, SDPA over the whole view (its output is out_proj's input: `transpose(1, 2).contiguous()` of a [b, s, h, d]
layout is no copy), out_proj, `lambda_1 *` (keeps out_proj's output when lambda_1 trains), residual, layernorm_after,
fc1, quick_gelu, fc2, `lambda_2 *` (keeps fc2's output when lambda_2 trains), residual) → `downsampler1` (keeps its
input, the last layer's output viewed [b, width, grid, grid], when it trains) → `downsampler2` (keeps its input
[b, 2 · width, grid / 2, grid / 2] when it trains) → `multi_modal_projector` on [b, (grid / 4)², 4 · width] (its
input kept when it trains). The image tokens' rows (each image's crops' then its global view's, `torch.cat`) are the
model output's pooler_output, alive until the trainer drops the output, then `torch.cat`, `masked_scatter`
(hpcmem.estimate.vision `feature_locals`).

Trained or frozen is what TRL and peft do: full fine-tuning trains all of it; LoRA all-linear adapts every linear of
the layers and the projector (peft tuners_utils.py `_maybe_include_all_linear_layers`; the Conv2d downsamplers are no
Linear). Step3p7VisionModel names no input embeddings, so under checkpointing with PEFT only the token embeddings'
output is hooked (`enable_input_require_grads`).
"""

from __future__ import annotations

from dataclasses import replace

from hpcmem.estimate import activations as act
from hpcmem.estimate.lora import LoraLayout, backward_bytes_per_input
from hpcmem.estimate.vision import (FP32, VisionTerms, adapters_saved, block_saved, block_spec, graphless_tower,
                                    layer_norm_saved, padding_mask_difference, token_leaf, tower_states, tower_weights,
                                    unused_tower)
from hpcmem.job.image_rules import image_rows
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import MicroBatch, Precision
from hpcmem.models.step3p7 import STRIDE, Step3p7TowerSpec


def _passes(job: JobSpec, v: Step3p7TowerSpec, images: int) -> tuple[tuple[int, int], ...]:
    """(views, patches per view) of each tower pass: the global views, then the local crops when there are any."""
    x, y = v.crops(job.train.image_height, job.train.image_width)
    out = ((images, v.patches),)
    return out + (((images * x * y, v.crop_patches),) if x * y else ())


def _after_layers(v: Step3p7TowerSpec, n: int, prec: Precision, trained: bool, adapted: list,
                  lora: LoraLayout) -> int:
    """The downsamplers and the projector on a pass of n patches: downsampler1's input [n, width],
    downsampler2's [n / 4, 2 · width] and the projector's [n / 16, 4 · width] when they train; the projector's adapter
    its own."""
    h, rows = v.hidden_size, n // STRIDE ** 2
    kept = prec.act * (h * n + 2 * h * (n // 4) + STRIDE * h * rows) if trained else 0
    return kept + adapters_saved([x for x in adapted if x.part == "merger"], rows, prec, lora)


def step3p7_terms(job: JobSpec, prec: Precision, lora: LoraLayout) -> VisionTerms:
    v: Step3p7TowerSpec = job.model.vision
    images, n = image_rows(job)
    adapted, _, weights = tower_weights(job, v, prec, lora)
    if images == 0:
        return unused_tower(weights)
    w, trained, gc = prec.weight, not lora.enabled, job.train.gradient_checkpointing
    h, hd = v.hidden_size, v.hidden_size // v.num_heads
    passes = _passes(job, v, images)
    tokens = images * v.image_tokens(job.train.image_height, job.train.image_width)
    pixels = sum(b * s for b, s in passes) * v.patch_dim * FP32
    if lora.enabled and not adapted and not gc:
        return graphless_tower(weights=weights, pixels=pixels, patches=n, image_tokens=tokens)
    st = tower_states(job, v, prec, lora, adapted)
    spec = replace(block_spec(v), fused_qkv=False)
    fulls, backs = [], []
    for b, s in passes:
        mb = MicroBatch(rows=b, seq=s, label_tokens=0, padding_free=False, source="", attn_implementation="sdpa")
        # block_saved counts out_proj's input beside SDPA's output (a concatenation elsewhere); here it is SDPA's
        # output itself: taken back; the layer scales keep out_proj's and fc2's outputs when they train
        full = block_saved(job, v, spec, mb, prec, v.block_params, tuple(adapted), lora)
        full += (prec.act * h * mb.tokens) if trained else 0
        # the views of a pass are all one size and the layers get no attention mask (Step3p7VisionModel.forward
        # passes none): no additive bias, though the pass has several rows
        full += padding_mask_difference(prec, mb, padded=False)
        fulls.append(full)
        hidden_t, mlp_t, scores_t = act.backward_parts(spec, mb, prec, "sdpa")
        layer_adapters = st.layer_adapters
        adapter_t = mb.tokens * max(x.in_features for x in layer_adapters) * backward_bytes_per_input(lora) \
            if layer_adapters else 0
        backs.append(hidden_t + max(mlp_t + adapter_t if gc else max(mlp_t, adapter_t), scores_t))
    per_layer = prec.residual * h * n if gc else sum(fulls)
    blocks = (per_layer,) * v.depth
    # before the layers, per pass: the Conv2d's bf16 input (trained), pre_layernorm's input and stats, the rope's
    # fp32 cos and sin [seq, head_dim]; under checkpointing with PEFT the token embeddings' hooked output
    conv = n * v.patch_dim * w if trained else 0
    pre = layer_norm_saved(h, prec, frozen=True) * n
    rope = sum(2 * FP32 * hd * s for _, s in passes)
    leaves = token_leaf(job, prec) if not trained and gc else 0
    merger_saved = sum(_after_layers(v, b * s, prec, trained, adapted, lora) for b, s in passes)
    saved = sum(blocks) + conv + pre + rope + leaves + merger_saved
    # alive until the trainer drops the model's outputs: pooler_output, each image's rows (a `torch.cat` of its crops'
    # and its global view's, or the global view's projector output itself)
    forward_only = prec.act * v.out_hidden_size * tokens
    what = ("tower, downsamplers and projector trained (full fine-tuning)" if trained else
            f"frozen; LoRA on {len(adapted)} of its linear kinds")
    return VisionTerms(weights=weights, gradients=st.grads, optimizer=st.opt, pixels=pixels, saved=saved,
                       merger_saved=merger_saved, blocks_saved=blocks, block_full=max(fulls),
                       block_backward=max(backs), block_grads=st.per_block * st.gbytes,
                       merger_grads=st.rest * st.gbytes, patches=n, image_tokens=tokens, trained=what,
                       forward_only=forward_only)

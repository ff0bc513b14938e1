"""Fuyu's image path in a vision-language job (hpcmem.models.fuyu `FuyuTowerSpec`): no tower, one nn.Linear over raw
pixel patches; its states, what its forward keeps for the backward, as hpcmem.estimate.vision's `VisionTerms`, which
`with_vision` places in the learned Persimmon text part's phases (hpcmem.models.vlm_learned).

How the step runs (transformers 5.24 models/fuyu/modeling_fuyu.py `FuyuModel.forward`, `get_image_features`):
pixel_values [N, patch² · 3] fp32 (the processor's `image_patches`, every image's patches concatenated;
FuyuForCausalLM's `deprecate_kwarg` renames it) → `vision_embed_tokens` (Linear with bias, to the text width; under
autocast its input cast to the compute dtype) → `.to(inputs_embeds.dtype)` → `masked_scatter` into the token
embeddings at the |SPEAKER| rows (`get_placeholder_mask`); the language model then runs on max_length embeddings as a
text-only step does. No block, nothing checkpointed, no separate tower backward: the Linear's backward (its weight's
gradient from the [N, width] rows masked_scatter hands back) runs after the language model's layers.

Trained or frozen is what TRL and peft do: full fine-tuning trains vision_embed_tokens; LoRA "all-linear" adapts it
(it is no output embedding: peft tuners_utils.py `_maybe_include_all_linear_layers`); other targets leave it frozen,
and since `enable_input_require_grads` hooks the language model's token embeddings only (FuyuModel's input embeddings
are the language model's), its forward then builds no graph.
"""

from __future__ import annotations

from hpcmem.estimate.lora import LORA_DROPOUT_MASK_BYTES, LoraLayout
from hpcmem.estimate.states import optimizer_bytes_per_param
from hpcmem.estimate.vision import (FP32, LAYER_NORM_STATS, VisionTerms, graphless_tower, token_leaf, tower_weights,
                                    unused_tower)
from hpcmem.job.image_rules import image_rows
from hpcmem.job.images import image_geometry
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import Precision, micro_batch
from hpcmem.models.fuyu import FuyuTowerSpec
from hpcmem.models.peft_targets import ALL_LINEAR


def fuyu_terms(job: JobSpec, prec: Precision, lora: LoraLayout) -> VisionTerms:
    v: FuyuTowerSpec = job.model.vision
    images, n = image_rows(job)
    adapted, _, weights = tower_weights(job, v, prec, lora)
    r, trained = job.train.lora_r, not lora.enabled
    gc = job.train.gradient_checkpointing
    if images == 0:
        return unused_tower(weights)
    pd, width = v.patch_dim, v.out_hidden_size
    tokens = images * image_geometry(job.train, v).tokens
    pixels = n * pd * FP32
    if lora.enabled and not adapted:
        return graphless_tower(weights=weights, pixels=pixels, patches=n, image_tokens=tokens,
                               saved=token_leaf(job, prec) if gc else 0,
                               why="no checkpointing" if not gc else "nothing hooks vision_embed_tokens")
    gbytes = prec.weight if trained else lora.adapter_bytes
    trainable = v.merger_params if trained else sum(r * (x.in_features + x.out_features) for x in adapted)
    grads = trainable * gbytes
    opt = int(trainable * optimizer_bytes_per_param(job.train.optim, gbytes))
    # full fine-tuning: vision_embed_tokens keeps its input for its weight gradient, under autocast the copy cast to the
    # compute dtype (the fp32 pixel_values themselves otherwise, counted in `pixels`)
    linear_in = n * pd * prec.act if trained and prec.amp else 0
    # LoRA: the frozen base keeps nothing (its input needs no gradient); the adapter's lora_A keeps its input (the
    # dropout output cast to the compute dtype under autocast; no dropout mask: nothing before it needs a gradient)
    # and lora_B its [N, r] input
    a = prec.act if prec.amp else lora.adapter_bytes
    adapter = n * (pd * a + r * a) if adapted else 0
    # masked_scatter keeps its boolean mask [rows, seq, 1]; under LoRA with checkpointing the hooked token embeddings'
    # output stays a leaf beside the scattered copy (hpcmem.estimate.vision `token_leaf`)
    mask = micro_batch(job).tokens
    saved = linear_in + adapter + mask + (token_leaf(job, prec) if gc and lora.enabled else 0) \
        + first_layer_input(job, prec, lora, adapted)
    # alive in the forward only: `patch_embeddings`, the Linear's [N, width] output (BaseModelOutputWithPooling's
    # last_hidden_state in mm_encoder_outputs), a local of FuyuModel.forward until it returns
    forward_only = prec.act * width * n
    what = ("vision_embed_tokens trained (full fine-tuning)" if trained else
            f"frozen; LoRA on {len(adapted)} of its linear kinds")
    return VisionTerms(weights=weights, gradients=grads, optimizer=opt, pixels=pixels, saved=saved,
                       merger_saved=saved, blocks_saved=(), block_full=0, block_backward=0, block_grads=0,
                       merger_grads=grads, patches=n, image_tokens=tokens, trained=what, forward_only=forward_only)


def first_layer_input(job: JobSpec, prec: Precision, lora: LoraLayout, adapted: tuple) -> int:
    """What decoder layer 0 keeps only because its input requires grad, under LoRA without checkpointing when
    vision_embed_tokens is adapted: its adapter's output makes `masked_scatter`'s output (layer 0's input) require
    grad, where a text-only step's input (the frozen token embeddings' output, no `enable_input_require_grads` hook
    without checkpointing) does not, which the learned text profile was traced as. modeling_persimmon.py
    `PersimmonDecoderLayer.forward`: `input_layernorm` (nn.LayerNorm, frozen; an fp32 op under autocast) then keeps its
    input cast to fp32 and its fp32 mean and rstd for the input gradient, and peft's dropout before
    `self_attn.query_key_value`'s adapter (its input, the norm's output, now requiring grad) keeps its mask.
    Checkpointing hooks the token embeddings in both (the profile has it), full fine-tuning trains them (likewise)."""
    if not lora.enabled or not adapted or job.train.gradient_checkpointing:
        return 0
    tokens, width = micro_batch(job).tokens, job.model.hidden_size
    norm = ((FP32 if prec.amp else prec.residual) * width + LAYER_NORM_STATS) * tokens
    targets = job.train.lora_target_modules
    qkv = ALL_LINEAR in targets or "query_key_value" in targets
    dropout = LORA_DROPOUT_MASK_BYTES * width * tokens if lora.dropout and qkv else 0
    return norm + dropout

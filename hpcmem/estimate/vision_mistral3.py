"""Mistral 3's Pixtral tower and projector in a vision-language job (hpcmem.models.pixtral): their states, what their
forward keeps for the backward, and the tower's backward, as hpcmem.estimate.vision's `VisionTerms`.

How the step runs (transformers 5.24 models/pixtral/modeling_pixtral.py `PixtralVisionModel.forward`,
models/mistral3/modeling_mistral3.py `Mistral3Model.get_image_features`): pixel_values [images, 3, H, W] fp32 (each
image at its own resized size, padded to the batch's largest) → `patch_conv` (its input cast to the weight dtype) →
each image's patches cut to its own grid and concatenated into one sequence [1, N, width] → `ln_pre` → the 2D rotary
cos and sin [N, head_dim] (`PixtralVisionRotaryEmbedding.forward`, cast to the hidden states' dtype) and one
block-diagonal additive mask [1, 1, N, N] in that dtype (`generate_block_attention_mask`: each image's patches see only
each other), both shared by every layer → `depth` PixtralAttentionLayers (a GradientCheckpointingLayer each: RMSNorm,
q/k/v/o_proj, SDPA with the mask, RMSNorm, gated MLP) → the projector on hidden_states[-1]: Mistral3RMSNorm, each
image's grid unfolded into merge² blocks and concatenated [N / merge², merge²·width] → merging_layer → linear_1 →
GELU → linear_2, whose output replaces the [IMG] tokens' embeddings.

A layer keeps what a decoder layer of the tower's shape keeps (hpcmem.estimate.vision `block_saved`: RMSNorms,
q/k/v/out, gated MLP) but the concatenated-attention input the Qwen towers' `proj` keeps: o_proj reads SDPA's output
itself, as llava's out_proj (hpcmem.estimate.vision_llava). The mask is the same tensor in every layer's SDPA, kept
for backward once; the rotary tables likewise.

Trained or frozen is what TRL and peft do: full fine-tuning trains the tower and the projector; LoRA "all-linear"
adapts q/k/v/o_proj, gate/up/down_proj of every layer and the projector's merging_layer, linear_1 and linear_2. The
tower names its patch embedding as its input embeddings (`PixtralVisionModel.get_input_embeddings` returns
`patch_conv`), which `enable_input_require_grads` hooks under checkpointing with PEFT.
"""

from __future__ import annotations

from dataclasses import replace

from hpcmem.estimate import activations as act
from hpcmem.estimate.lora import LoraLayout, backward_bytes_per_input
from hpcmem.estimate.states import optimizer_bytes_per_param
from hpcmem.estimate.vision import (FP32, VisionTerms, adapters_saved, block_saved, block_spec, graphless_tower,
                                    token_leaf, tower_weights, trained_parts, unused_tower)
from hpcmem.job.image_rules import image_rows
from hpcmem.job.images import image_geometry
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import MicroBatch, Precision
from hpcmem.models.pixtral import PixtralTowerSpec


def pixtral_terms(job: JobSpec, prec: Precision, lora: LoraLayout) -> VisionTerms:
    v: PixtralTowerSpec = job.model.vision
    images, n = image_rows(job)
    adapted, adapter_params, weights = tower_weights(job, v, prec, lora)
    r, w, trained = job.train.lora_r, prec.weight, not lora.enabled
    gc = job.train.gradient_checkpointing
    if images == 0:
        return unused_tower(weights)
    # the merger's rows: each image's grid unfolded in merge × merge blocks (Mistral3PatchMerger.forward)
    h, o, m = v.hidden_size, v.out_hidden_size, images * v.merged_tokens(job.train.image_height, job.train.image_width)
    text_tokens = images * image_geometry(job.train, v).tokens
    pixels = n * v.patch_dim * FP32
    if lora.enabled and not adapted and not gc:
        # no adapter in the tower or the projector and no `enable_input_require_grads` hook (TRL installs it for PEFT
        # under checkpointing only): nothing there requires grad, so it builds no graph and runs no backward
        return graphless_tower(weights=weights, pixels=pixels, patches=n, image_tokens=text_tokens)
    gbytes = w if trained else lora.adapter_bytes
    tower_adapters = [x for x in adapted if x.part == "tower"]
    merger_adapters = [x for x in adapted if x.part == "merger"]
    per_block, merger = trained_parts(v, tower_adapters, merger_adapters, r, trained)
    trainable = (v.embed_params if trained else 0) + per_block * v.depth + merger
    grads = trainable * gbytes
    opt = int(trainable * optimizer_bytes_per_param(job.train.optim, gbytes))
    # PixtralAttention's q, k, v are three Linears without bias
    spec = replace(block_spec(v), fused_qkv=False, qkv_bias=False, o_bias=False, mlp_bias=False)
    mb = MicroBatch(rows=1, seq=n, label_tokens=0, padding_free=False, source="", attn_implementation="sdpa")
    block = block_saved(job, v, spec, mb, prec, v.block_params, adapted, lora) - (prec.act * h * n if trained else 0)
    blocks = (prec.residual * h * n,) * v.depth if gc else (block,) * v.depth
    # before the layers: patch_conv's input (pixel_values in the weight dtype) for its weight gradient; frozen under
    # checkpointing, the hooked patch_conv's output and the token embeddings' output are leaves; ln_pre keeps its fp32
    # upcast for the input gradient, and its normalised tensor for its weight's when it trains (its output feeds the
    # residual stream, not a linear); the rotary cos/sin and the mask, in ln_pre's output dtype, kept by every layer
    conv = n * v.patch_dim * w if trained else 0
    hooked = not trained and gc
    leaves = n * h * w + token_leaf(job, prec) if hooked else 0
    pre = (FP32 + (prec.residual if trained else 0)) * h * n if trained or hooked else 0
    rope = 2 * n * (h // v.num_heads) * prec.residual
    mask = n * n * prec.residual
    # the projector: its RMSNorm's fp32 upcast (and normalised tensor when its weight trains), merging_layer's input
    # (the unfolded [M, merge²·width] concatenation, M the merged blocks) and linear_1's when they train, GELU's
    # input, linear_2's input when it trains, the adapters' own
    merger_saved = ((FP32 + (prec.residual if trained else 0)) * h * n
                    + (prec.act * (h * v.merge_unit * m + h * m) if trained else 0)
                    + prec.act * o * m * (2 if trained else 1)
                    + adapters_saved(merger_adapters, m, prec, lora))
    saved = sum(blocks) + conv + leaves + pre + rope + mask + merger_saved
    hidden_t, mlp_t, scores_t = act.backward_parts(spec, mb, prec, "sdpa")
    adapter_t = n * max(x.in_features for x in tower_adapters) * backward_bytes_per_input(lora) \
        if tower_adapters else 0
    # alive until the trainer drops the model's outputs: the layers' outputs `capture_outputs` records for
    # hidden_states (the embeddings' and each layer's), which without checkpointing nothing else keeps when the
    # residual stream is 16-bit (PixtralRMSNorm saves its fp32 upcast, not its input); a tower read through
    # last_hidden_state records none (modeling_lighton_ocr.py `LightOnOcrModel.get_image_features`)
    recorded = (v.depth + 1) * prec.residual * h * n \
        if v.records_hidden_states and prec.residual != FP32 and not gc else 0
    # DPO's reference forward past its tower, through its language model (no grad, so nothing saved): the tower's
    # last_hidden_state, held in the image outputs the model's forward keeps (modeling_mistral3.py
    # `Mistral3Model.get_image_features`, `forward`), which is also the one hidden state recorded
    # (`select_hidden_states("vision_feature_layer")`, -1: transformers/utils/output_capturing.py keeps the selected
    # layers' outputs alone), the projector's output (split into views) and its `torch.cat` copy, cast to the token
    # embeddings' dtype where autocast left it in another
    reference_lm = (prec.residual * h * n + prec.act * o * m
                    + (prec.act + (prec.weight if prec.weight != prec.act else 0)) * o * m)
    # DPO's reference forward (no grad) beside the policy's saved tensors: patch_conv's output (the per-image views
    # `patch_embeds_list` keeps), ln_pre's output (the transformer's input), the mask and rotary tables, and at the
    # last block's MLP its input, the attention's residual sum, ffn_norm's output and act(gate), up and their product
    # [N, intermediate] (PixtralVisionModel.forward, PixtralAttentionLayer.forward, PixtralMLP.forward)
    last_input = prec.residual * h * n if v.depth > 1 else 0
    reference = (prec.act * h * n + prec.residual * h * n + mask + rope + last_input
                 + 2 * prec.residual * h * n + 3 * prec.act * v.intermediate_size * n)
    what = ("tower and projector trained (full fine-tuning)" if trained else
            f"frozen; LoRA on {len(adapted)} of its linear kinds")
    return VisionTerms(weights=weights, gradients=grads, optimizer=opt, pixels=pixels, saved=saved,
                       merger_saved=merger_saved, blocks_saved=blocks, block_full=block,
                       block_backward=hidden_t + max(mlp_t + adapter_t if gc else max(mlp_t, adapter_t), scores_t),
                       block_grads=per_block * gbytes, merger_grads=merger * gbytes, patches=n,
                       image_tokens=text_tokens, trained=what, forward_only=recorded, reference_pass=reference,
                       reference_forward=reference_lm)

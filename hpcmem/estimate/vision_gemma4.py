"""Gemma 4's vision encoder, pooler and embedder in a vision-language SFT job (hpcmem.models.gemma4; Gemma 4
unified's encoder-free embedder in `gemma4_unified_terms`): their states,
what their forward keeps for the backward, and the encoder's backward, as hpcmem.estimate.vision's `VisionTerms`,
which `with_vision` places in the learned text part's phases (hpcmem.models.vlm_learned).

How the step runs (transformers 5.24 models/gemma4/modeling_gemma4.py `Gemma4Model.get_image_features`,
`Gemma4VisionModel.forward`): pixel_values [images, P, 3 · patch²] fp32, every image padded to P = max_soft_tokens ·
k² patch rows → `Gemma4VisionPatchEmbedder` (`2 · (x − 0.5)`, cast to the weight dtype, `input_proj`, plus the x and y
rows of the position table, zero on padding) → `Gemma4VisionEncoder`: the bidirectional padding mask [images, 1, P, P]
(`create_bidirectional_mask`; none when no row is padding), the 2-D rotary cos and sin [images, P, head_dim] in the
hidden dtype (`Gemma4VisionRotaryEmbedding`), both shared by every layer → `depth` Gemma4VisionEncoderLayers over
[images, P, width] → `Gemma4VisionPooler` (padding zeroed, the k × k average as a matmul with fp32 one-hot weights
[images, P, P / k²], √width in fp32, padding rows dropped) → `embed_vision` (weightless RMSNorm, embedding_projection)
on the T image tokens → `masked_scatter` into the text embeddings.

A layer keeps what hpcmem.estimate.activations' decoder layer of its shape keeps (`block_saved`: four Gemma RMSNorms,
whose fp32 normalised tensor is kept for the weight multiply — activations `FP32_NORM_MULTIPLY` —, q/k norms over
head_dim, q/k/v, SDPA's output and logsumexp, the gated MLP's four [P, intermediate] tensors, o_proj's input copy),
plus what Gemma 4's attention adds (`Gemma4VisionAttention.forward`): v_norm's fp32 upcast over the kv width (a
Gemma4RMSNorm without a weight: pow and the multiply keep it) and, with padding, the additive [images, 1, P, P] bias
SDPA makes of the boolean mask and keeps (activations `_attention_saved`, per layer). The 2-D rotary
(`apply_multidimensional_rope`: each half of head_dim rotated by its own cos/sin slice and concatenated) keeps only
views of the shared cos and sin, as the 1-D rotary does.

Trained or frozen is what TRL and peft do: full fine-tuning trains all of it; LoRA "all-linear" adapts every layer's
q/k/v/o_proj and gate/up/down_proj (the nn.Linear inside each Gemma4ClippableLinear), the patch embedder's input_proj
and embed_vision's embedding_projection. Nothing hooks the tower (Gemma4VisionModel has no input embeddings:
hpcmem.models.gemma4 `hooked_input`), so under LoRA its graph starts at input_proj's adapter.
"""

from __future__ import annotations

from dataclasses import replace

from hpcmem.estimate import activations as act
from hpcmem.estimate.lora import LoraLayout, backward_bytes_per_input
from hpcmem.estimate.states import optimizer_bytes_per_param
from hpcmem.estimate.vision import (FP32, VisionTerms, adapters_saved, block_saved, block_spec, graphless_tower,
                                    layer_norm_saved, padding_mask_difference, token_leaf, tower_weights, trained_parts,
                                    unused_tower)
from hpcmem.job.image_rules import image_rows
from hpcmem.job.images import image_geometry
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import MicroBatch, Precision
from hpcmem.models.gemma4 import Gemma4TowerSpec

INT64 = 8


def gemma4_terms(job: JobSpec, prec: Precision, lora: LoraLayout) -> VisionTerms:
    v: Gemma4TowerSpec = job.model.vision
    images, n = image_rows(job)
    adapted, adapter_params, weights = tower_weights(job, v, prec, lora)
    r, w, trained = job.train.lora_r, prec.weight, not lora.enabled
    gc = job.train.gradient_checkpointing
    if images == 0:
        return unused_tower(weights)
    g = image_geometry(job.train, v)
    h, p, tokens = v.hidden_size, v.max_patches, images * g.tokens
    pixels = n * v.patch_dim * FP32
    if lora.enabled and not adapted:
        # no adapter in the tower or the embedder and no hook on it: no graph, no backward; the text embeddings'
        # output, hooked under checkpointing, stays a leaf beside the masked_scatter copy (`token_leaf`)
        return graphless_tower(weights=weights, pixels=pixels, patches=n, image_tokens=tokens,
                               saved=token_leaf(job, prec) if gc else 0,
                               why="no checkpointing" if not gc else "nothing hooks its patch embedder")
    gbytes = w if trained else lora.adapter_bytes
    tower_adapters = [x for x in adapted if x.part == "tower"]
    embed_adapters = [x for x in adapted if x.part == "embed"]
    merger_adapters = [x for x in adapted if x.part == "merger"]
    per_block, merger = trained_parts(v, tower_adapters, merger_adapters, r, trained)
    embed = v.embed_params if trained else sum(r * (x.in_features + x.out_features) for x in embed_adapters)
    trainable = embed + per_block * v.depth + merger
    grads = trainable * gbytes
    opt = int(trainable * optimizer_bytes_per_param(job.train.optim, gbytes))
    # Gemma4VisionAttention: q/k/v/o_proj without bias, q_norm and k_norm over head_dim; four sandwich RMSNorms
    spec = replace(block_spec(v), model_type="gemma4_vision", head_dim=v.head_dim, qkv_bias=False, o_bias=False,
                   mlp_bias=False, fused_qkv=False, qk_norm=True, norms_per_layer=4)
    mb = MicroBatch(rows=images, seq=p, label_tokens=0, padding_free=False, source="", attn_implementation="sdpa")
    padded = g.grid_thw[1] * g.grid_thw[2] < p
    kv = v.num_key_value_heads * v.head_dim
    # v_norm's fp32 upcast; SDPA's additive bias of the mask and k/v repeated to every head under GQA
    # (transformers' `use_gqa_in_sdpa`) where the images are padded, which the decoder-layer terms count where
    # several rows are (`MicroBatch.masked`)
    extra = FP32 * kv * n + padding_mask_difference(prec, mb, padded, v.num_heads * v.head_dim - kv)
    block = block_saved(job, v, spec, mb, prec, v.block_params, tuple(adapted), lora) + extra
    blocks = (prec.residual * h * n,) * v.depth if gc else (block,) * v.depth
    # before the layers: input_proj's input (pixel_values cast to the weight dtype) when it trains, the adapter's own
    # under LoRA; the position lookups' int64 x and y indices; the rotary cos and sin; the boolean mask, an input of
    # every checkpointed layer under checkpointing; the text embeddings' hooked output under LoRA with checkpointing
    conv = n * v.patch_dim * w if trained else adapters_saved(embed_adapters, n, prec, lora)
    positions = 2 * INT64 * n
    rope = 2 * n * v.head_dim * prec.residual
    mask = images * p * p if padded and gc else 0
    leaves = token_leaf(job, prec) if gc and lora.enabled else 0
    # the pooler: its matmul keeps the fp32 one-hot weights [images, P, P / k²] (the hidden states' side needs no
    # weight gradient); embed_vision: the weightless RMSNorm's fp32 upcast on the T image tokens, the projection's
    # input when it trains, its adapter's own
    pool = images * p * (p // v.merge_unit) * FP32
    merger_saved = (pool + FP32 * h * tokens + (prec.act * h * tokens if trained else 0)
                    + adapters_saved(merger_adapters, tokens, prec, lora))
    saved = sum(blocks) + conv + positions + rope + mask + leaves + merger_saved
    hidden_t, mlp_t, scores_t = act.backward_parts(spec, mb, prec, "sdpa")
    adapter_t = n * max(x.in_features for x in tower_adapters) * backward_bytes_per_input(lora) \
        if tower_adapters else 0
    what = ("tower and embedder trained (full fine-tuning)" if trained else
            f"frozen; LoRA on {len(adapted)} of its linear kinds")
    return VisionTerms(weights=weights, gradients=grads, optimizer=opt, pixels=pixels, saved=saved,
                       merger_saved=merger_saved, blocks_saved=blocks, block_full=block,
                       block_backward=hidden_t + max(mlp_t + adapter_t if gc else max(mlp_t, adapter_t), scores_t),
                       block_grads=per_block * gbytes, merger_grads=merger * gbytes, patches=n,
                       image_tokens=tokens, trained=what)


def gemma4_unified_terms(job: JobSpec, prec: Precision, lora: LoraLayout) -> VisionTerms:
    """Gemma 4 unified's encoder-free embedder (hpcmem.models.gemma4 `Gemma4UnifiedTowerSpec`;
    modular_gemma4_unified.py `Gemma4UnifiedVisionEmbedder.forward`, `Gemma4UnifiedModel.get_image_features`):
    pixel_values [images, S, pd] fp32 (S = max_soft_tokens rows, pd = (patch · k)² · 3) cast to the weight dtype →
    patch_ln1 → patch_dense → patch_ln2 → + the gathered x/y position rows times the validity mask, summed → pos_norm
    → the weightless Gemma4RMSNorm (fp32) → embedding_projection on all N = images · S rows → the boolean index that
    drops the padding rows → masked_scatter. No blocks: everything it keeps is the connector's (`merger_saved`)."""
    v = job.model.vision
    images, n = image_rows(job)
    adapted, _, weights = tower_weights(job, v, prec, lora)
    r, w, trained = job.train.lora_r, prec.weight, not lora.enabled
    gc = job.train.gradient_checkpointing
    if images == 0:
        return unused_tower(weights)
    g = image_geometry(job.train, v)
    d, pd, tokens = v.hidden_size, v.patch_dim, images * g.tokens
    pixels = n * pd * FP32
    if lora.enabled and not adapted:
        return graphless_tower(weights=weights, pixels=pixels, patches=n, image_tokens=tokens,
                               saved=token_leaf(job, prec) if gc else 0,
                               why="no checkpointing" if not gc else "nothing hooks its embedder")
    gbytes = w if trained else lora.adapter_bytes
    a = prec.act if prec.amp else lora.adapter_bytes
    embed_adapters = [x for x in adapted if x.part == "embed"]
    merger_adapters = [x for x in adapted if x.part == "merger"]
    embed = v.embed_params if trained else sum(r * (x.in_features + x.out_features) for x in embed_adapters)
    merger = v.merger_params if trained else sum(r * (x.in_features + x.out_features) for x in merger_adapters)
    trainable = embed + merger
    grads = trainable * gbytes
    opt = int(trainable * optimizer_bytes_per_param(job.train.optim, gbytes))
    # patch_ln1 (its input, the cast pixels, and its stats; its output, patch_dense's input, when patch_dense
    # trains) only when it trains: under LoRA nothing before patch_dense's adapter needs a gradient
    ln1 = layer_norm_saved(pd, prec, frozen=False) * n if trained else 0
    # patch_ln2 and pos_norm: their inputs and stats (the graph runs through both from patch_dense on)
    norms = 2 * layer_norm_saved(d, prec, frozen=True) * n
    # the position lookup: its int64 [N, 2] index and, when the table trains, the validity mask the mul keeps
    positions = 2 * INT64 * n + (2 * w * n if trained else 0)
    # embed_vision's RMSNorm keeps its fp32 upcast over N rows, the projection its input when it trains; the
    # padding rows' boolean mask
    proj = FP32 * d * n + (prec.act * d * n if trained else 0) + n
    # patch_dense's adapter keeps lora_A's input and output but no dropout mask: its input (patch_ln1's output) needs
    # no gradient, so peft's dropout saves none
    embed_saved = sum(x.in_features * a + lora.r * a for x in embed_adapters) * n if embed_adapters else 0
    saved = (ln1 + norms + positions + proj + embed_saved + adapters_saved(merger_adapters, n, prec, lora)
             + (token_leaf(job, prec) if gc and lora.enabled else 0))
    # alive in the forward with the model's output (Gemma4UnifiedModelOutputWithPast.image_outputs): pos_norm's output
    # (last_hidden_state, fp32 under autocast, where layer_norm is an fp32 op) and the image tokens' rows
    # (pooler_output, split views of one [T, text width] tensor); Gemma4UnifiedModel.forward's `image_features`, the
    # torch.cat copy of them that masked_scatter reads, a local until the forward returns
    forward_only = (FP32 if prec.amp else prec.residual) * d * n + 2 * prec.act * v.out_hidden_size * tokens
    what = ("embedder trained (full fine-tuning)" if trained else
            f"frozen; LoRA on {len(adapted)} of its linear kinds")
    return VisionTerms(weights=weights, gradients=grads, optimizer=opt, pixels=pixels, saved=saved,
                       merger_saved=saved, blocks_saved=(), block_full=0, block_backward=0, block_grads=0,
                       merger_grads=grads, patches=n, image_tokens=tokens, trained=what, forward_only=forward_only)

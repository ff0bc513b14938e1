"""Inkling 2's tower and patch merger in a vision-language job (hpcmem.models.inkling2), as hpcmem.estimate.vision's
`VisionTerms`, which `with_vision` places in the learned text part's phases (hpcmem.models.vlm_learned).

How the step runs (transformers 5.24 models/inkling2/modeling_inkling2.py `Inkling2Model.get_image_features`,
`Inkling2VisionModel.forward`): pixel_values [cells, 40, 40, 3] fp32 (one row per image token) cast to the patch
embedding's dtype (a 16-bit copy with 16-bit weights, a local until the tower returns) →
`Inkling2VisionEmbeddings`: each cell cut into merge² patches (`reshape(...).transpose(2, 3)` then `reshape`: a copy
[N, 3 · 20²]), `patch_embedding` (an nn.Linear without bias: it keeps that copy, in the compute dtype, for its weight
gradient when it trains) plus the position table interpolated bilinearly (`get_vision_interpolation_indices_and_
weights`: int64 indices and fp32 weights [N, 4] made on the host and copied to the device; `position_embedding(
indices)` [N, 4, width] in the weights' dtype, times the fp32 weights → fp32 [N, 4, width], `.sum(1)`, cast to the
patch rows' dtype: the embedding keeps the indices and the product the weights when the table trains — the two
[N, 4, width] tensors are transients, `embedding_instant`) → `cls_embedding.repeat(N + images, 1)` with the patch rows
written in by `embeddings[patch_index] = ...` (index_put keeps the int64 patch_index [N]) → `pre_layernorm` (its
fp32 input under autocast and statistics kept; its output, fp32 under autocast, is the residual stream: every layer's
residual adds stay fp32) → the axial rope's fp32 cos and sin [N + images, head_dim] (`Inkling2VisionRotaryEmbedding`,
built once, kept by every layer's `q * cos`, `rotate_pairwise(q) * sin`) → the layers (`Inkling2VisionEncoderLayer`,
Step3p7VisionEncoderLayer's, a GradientCheckpointingLayer: under checkpointing its fp32 input alone; else
layernorm_before, q/k/v_proj as three Linears, the rope in fp32 cast back, SDPA per image on the cu_seqlens splits
with no mask, the chunks' `torch.cat` that out_proj keeps, `lambda_1 *` (keeps out_proj's output when lambda_1
trains), residual, layernorm_after, fc1, gelu, fc2, `lambda_2 *` (keeps fc2's output when lambda_2 trains), residual)
→ `hidden_states[patch_index]`: the patches' rows without the class tokens (fp32 under autocast; its backward keeps
only the index) → `Inkling2VisionMerger` on [N / 4, 4 · width]: linear_1 (keeps its 16-bit input when it trains) →
gelu (keeps its input) → linear_2 (keeps gelu's output when it trains) → pooler_output, split per image.
`Inkling2Model.forward` concatenates the splits and casts them to the token embeddings' dtype for `masked_scatter`
(hpcmem.estimate.vision `feature_locals`); the model's output keeps the tower's last_hidden_state and the splits
(`image_outputs`) until the trainer drops it before the backward.

Trained or frozen is what TRL and peft do: full fine-tuning trains all of it; LoRA all-linear adapts every Linear of
the layers, patch_embedding and the merger's two (peft tuners_utils.py `_maybe_include_all_linear_layers`).
Inkling2VisionModel names no input embeddings, so under checkpointing with PEFT only the token embeddings' output is
hooked (`enable_input_require_grads`). Under LoRA without checkpointing the adapted tower's features make the first
decoder layer's input require grad, which the text profile was not traced with: hpcmem.estimate.vision_inkling2_text.
"""

from __future__ import annotations

from dataclasses import replace

from hpcmem.estimate import activations as act
from hpcmem.estimate.lora import LoraLayout, backward_bytes_per_input
from hpcmem.estimate.vision_inkling2_text import first_layer_input
from hpcmem.estimate.vision import (FP32, VisionTerms, adapters_saved, block_saved, block_spec, feature_locals,
                                    graphless_tower, layer_norm_saved, padding_mask_difference, token_leaf,
                                    tower_states, tower_weights, unused_tower)
from hpcmem.job.image_rules import image_rows
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import MicroBatch, Precision
from hpcmem.models.inkling2 import Inkling2TowerSpec

INT64 = 8
TAPS = 4        # bilinear interpolation: 2 × 2 table rows per patch (vision_utils.py
#                 `get_vision_interpolation_indices_and_weights`, mode "bilinear")


def embeddings_saved(v: Inkling2TowerSpec, n: int, prec: Precision, trained: bool, adapted: list,
                     lora: LoraLayout) -> int:
    """What `Inkling2VisionEmbeddings` keeps for N patches: patch_embedding's input copy when it trains (its
    adapter's own under LoRA, without a dropout mask: the pixel rows require no grad, so the dropout records no node,
    as in hpcmem.estimate.vision_cosmos3_edge), the interpolation's int64 indices and fp32 weights [N, 4] when the
    table trains, and index_put's int64 patch_index [N] whenever the patch rows require grad."""
    patch_in = n * v.patch_dim * prec.act if trained else 0
    own = adapters_saved([x for x in adapted if x.part == "embed"], n, prec, replace(lora, dropout=False))
    table = TAPS * (INT64 + FP32) * n if trained else 0
    grad_rows = trained or any(x.part == "embed" for x in adapted)
    return patch_in + own + table + (INT64 * n if grad_rows else 0)


def embedding_instant(v: Inkling2TowerSpec, n: int, prec: Precision) -> int:
    """The interpolated position embeddings' worst instant beyond what the embeddings keep: the fp32 product
    [N, 4, width] beside the embedding lookup it is made from ([N, 4, width], weights' dtype) or beside its
    `.sum(1)` [N, width] fp32, whichever is larger, with the host-made indices and weights' device copies
    (`Inkling2VisionEmbeddings.forward`)."""
    h = v.hidden_size
    product = FP32 * TAPS * h * n
    return product + max(prec.weight * TAPS * h, FP32 * h) * n + TAPS * (INT64 + FP32) * n


def merger_saved(v: Inkling2TowerSpec, n: int, prec: Precision, trained: bool, adapted: list,
                 lora: LoraLayout) -> int:
    """The merger on N / 4 rows: linear_1's 16-bit input [N / 4, 4 · width] when it trains, gelu's input
    [N / 4, projection_hidden_dim], linear_2's input when it trains, the adapters' own."""
    rows = n // v.merge_unit
    linear_1 = prec.act * v.merged_width * rows if trained else 0
    mlp = prec.act * v.projector_hidden * rows * (2 if trained else 1)
    return linear_1 + mlp + adapters_saved([x for x in adapted if x.part == "merger"], rows, prec, lora)


def inkling2_terms(job: JobSpec, prec: Precision, lora: LoraLayout) -> VisionTerms:
    v: Inkling2TowerSpec = job.model.vision
    images, n = image_rows(job)
    adapted, _, weights = tower_weights(job, v, prec, lora)
    if images == 0:
        return unused_tower(weights)
    trained, gc = not lora.enabled, job.train.gradient_checkpointing
    h, hd = v.hidden_size, v.hidden_size // v.num_heads
    seq = n + images                 # each image's patches and its class token
    tokens = n // v.merge_unit
    pixels = n * v.patch_dim * FP32
    if lora.enabled and not adapted and not gc:
        return graphless_tower(weights=weights, pixels=pixels, patches=n, image_tokens=tokens)
    st = tower_states(job, v, prec, lora, adapted)
    # the residual stream after pre_layernorm: fp32 under autocast (layer_norm's output), else the weights' dtype
    resid = FP32 if prec.amp else prec.residual
    # the layers: q/k/v three Linears; each image one chunk of the cu_seqlens attention, whose outputs'
    # concatenation out_proj keeps (block_saved's `proj_in`); no attention mask though a pass holds several images
    spec = replace(block_spec(v), fused_qkv=False)
    mb = MicroBatch(rows=images, seq=seq // images, label_tokens=0, padding_free=False, source="",
                    attn_implementation="sdpa")
    full = block_saved(job, v, spec, mb, prec, v.block_params, tuple(adapted), lora)
    full += padding_mask_difference(prec, mb, padded=False)
    # the layer scales keep out_proj's and fc2's outputs when they train
    full += 2 * prec.act * h * seq if trained else 0
    blocks = (resid * h * seq,) * v.depth if gc else (full,) * v.depth
    # before the layers: the embeddings', pre_layernorm's input and statistics over every row, the rope's fp32 cos
    # and sin; under checkpointing with PEFT the token embeddings' hooked output
    embed = embeddings_saved(v, n, prec, trained, adapted, lora)
    pre = layer_norm_saved(h, prec, frozen=True) * seq
    rope = 2 * FP32 * hd * seq
    leaves = token_leaf(job, prec) if not trained and gc else 0
    merger = merger_saved(v, n, prec, trained, adapted, lora)
    saved = sum(blocks) + embed + pre + rope + leaves + merger
    hidden_t, mlp_t, scores_t = act.backward_parts(spec, mb, prec, "sdpa")
    layer_adapters = st.layer_adapters
    adapter_t = mb.tokens * max(x.in_features for x in layer_adapters) * backward_bytes_per_input(lora) \
        if layer_adapters else 0
    # the interpolation's instant comes before any layer runs: only the embeddings' saved tensors and the pixel
    # rows' 16-bit copies beside it; an instant phase after the layers (`connector_forward`) holds every block's
    # saved tensors besides, so it adds one only where the instant outgrows those
    copies = 2 * n * v.patch_dim * prec.weight if prec.weight != FP32 else n * v.patch_dim * FP32
    outside = embed + pre + rope + leaves
    instant = embedding_instant(v, n, prec) + copies + prec.act * h * n
    connector_forward = max(0, embed + instant - outside - sum(blocks))
    # alive until the trainer drops the model's outputs: last_hidden_state (the fp32 residual under autocast) and the
    # split image features with their concatenated cast (`feature_locals`)
    forward_only = resid * h * seq + feature_locals(v, tokens, prec)
    what = ("tower and merger trained (full fine-tuning)" if trained else
            f"frozen; LoRA on {len(adapted)} of its linear kinds")
    return VisionTerms(weights=weights, gradients=st.grads, optimizer=st.opt, pixels=pixels, saved=saved,
                       merger_saved=merger, blocks_saved=blocks, block_full=full,
                       block_backward=hidden_t + max(mlp_t + adapter_t if gc else max(mlp_t, adapter_t), scores_t),
                       block_grads=st.per_block * st.gbytes, merger_grads=st.rest * st.gbytes, patches=n,
                       image_tokens=tokens, trained=what, forward_only=forward_only,
                       connector_forward=connector_forward, text_saved=first_layer_input(job, prec, lora, adapted))

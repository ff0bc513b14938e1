"""Muse Glimmer's tower, vision adapter and projection in a vision-language job (hpcmem.models.muse_glimmer), as
hpcmem.estimate.vision's `VisionTerms`, which `with_vision` places in the learned text part's phases
(hpcmem.models.vlm_learned).

How the step runs (transformers 5.24 models/muse_glimmer/modeling_muse_glimmer.py `MuseGlimmerModel.
get_image_features`, `MuseGlimmerVisionModel.forward`): pixel_values [N, 2 · 3 · 14²] fp32 (every patch of every
image one row) → `MuseGlimmerVisionPatchEmbedder.forward`: `pixel_values.to(patch_embedding.weight.dtype)` (a 16-bit
copy, which patch_embedding, an nn.Linear without bias, keeps for its weight gradient when it trains), plus the
position table read at 4 bilinear taps a row (`position_embedding_table(interp_indices)`, [N, 4, width], times the
fp32 weights: an fp32 [N, 4, width] product summed over the taps, all transients; the Embedding keeps its int64
indices and the product the fp32 weights when the table trains) → `ln_pre` (a LayerNorm under autocast: keeps its
input cast to fp32 and its statistics; its fp32 output makes the layers' residual stream fp32) →
`hidden_states[window_index]` (the gather keeps its int64 index) → the axial rope's cos and sin [N, head_dim] in the
residual's dtype, fp32 (`MuseGlimmerVisionRotaryEmbedding.forward`: `.to(dtype=x.dtype)`), built once and kept by
every layer's `q * cos` and `rotate_half(q) * sin` (`apply_rotary_pos_emb_vision`) → the layers
(`MuseGlimmerVisionEncoderLayer`, Kimi K2.5's, a GradientCheckpointingLayer: under checkpointing its fp32 input alone;
else norm1, q/k/v_proj as three Linears, the rope in fp32 cast back, SDPA per window or per image on the cu_seqlens
splits whose outputs' `torch.cat` proj keeps, norm2, fc1, GELU, fc2: hpcmem.estimate.vision `block_saved`, and the
three 16-bit casts of norm1's fp32 output that q_proj, k_proj and v_proj each make and keep when they train) →
`hidden_states[reverse_indices]` (its index kept) → `ln_post` (keeps that fp32 gather as its input, and its
statistics) → `pixel_shuffle`: a gather (its index kept) viewed [N / 4, 4, width], permuted and reshaped: an fp32
[N / 4, 4 · width] copy, the output's last_hidden_state → `vision_adapter` (fc1 keeps autocast's 16-bit copy of it
when it trains; GELU keeps its input; fc2 keeps GELU's output when it trains; GELU again) → `vision_projection` (keeps
its input when it trains) → `perception_emb_norm` (MuseGlimmerRMSNorm without weight: `.float()`, whose fp32 copy
`pow` and the product keep, beside the [N / 4, 1] mean square and its power) → split per image into `pooler_output`,
whose `torch.cat` masked_scatter reads (hpcmem.estimate.vision `feature_locals`). `MuseGlimmerModel.forward` returns
the vision outputs (`image_outputs`) until the trainer drops the model's output: last_hidden_state and the split
features are forward-only.

Trained or frozen is what TRL and peft do: full fine-tuning trains all of it; LoRA all-linear adapts every linear of
the layers, patch_embedding, the adapter's two and the projection (peft tuners_utils.py
`_maybe_include_all_linear_layers`). MuseGlimmerVisionModel names no input embeddings (`get_input_embeddings`
raises NotImplementedError, which `enable_input_require_grads` skips), so under checkpointing with PEFT only the
token embeddings' output is hooked.
"""

from __future__ import annotations

from dataclasses import replace

from hpcmem.estimate import activations as act
from hpcmem.estimate.lora import LoraLayout, backward_bytes_per_input
from hpcmem.estimate.vision import (FP32, VisionTerms, adapters_saved, block_saved, block_spec, feature_locals,
                                    graphless_tower, layer_norm_saved, token_leaf, tower_states, tower_weights,
                                    unused_tower)
from hpcmem.job.image_rules import image_rows
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import MicroBatch, Precision
from hpcmem.models.muse_glimmer import MuseGlimmerTowerSpec

INT64 = 8
TAPS = 4        # bilinear interpolation: 2 × 2 table rows per patch (vision_utils.py
#                 `get_vision_interpolation_indices_and_weights`, mode "bilinear")
# `perception_emb_norm`'s per-row tensors besides its fp32 copy: the mean square (`torch.pow`'s input) and its power
# (the product's other factor), fp32 [rows, 1] each
NORM_ROW = 2 * FP32


def embed_saved(v: MuseGlimmerTowerSpec, n: int, prec: Precision, trained: bool, adapted: list,
                lora: LoraLayout) -> int:
    """Before the layers: patch_embedding's 16-bit input copy and the table's int64 indices and fp32 tap weights
    when they train (patch_embedding's adapter's own otherwise, without a dropout mask), ln_pre's fp32 input and statistics (its output feeds
    a gather, not a linear) and the window gather's int64 index."""
    trained_part = n * (v.patch_dim * prec.act + TAPS * (INT64 + FP32)) if trained else 0
    # the adapter's input, the pixel rows' 16-bit copy, requires no grad: its dropout records no node and keeps no
    # mask (lora_A keeps its own input)
    own = adapters_saved([x for x in adapted if x.part == "embed"], n, prec, replace(lora, dropout=False))
    return trained_part + own + layer_norm_saved(v.hidden_size, prec, frozen=True) * n + INT64 * n


def merger_saved(v: MuseGlimmerTowerSpec, n: int, prec: Precision, trained: bool, adapted: list,
                 lora: LoraLayout) -> int:
    """After the layers: the reverse window gather's and pixel_shuffle's int64 indices, ln_post's fp32 input and
    statistics, and on the N / 4 merged rows: fc1's 16-bit input, fc2's and vision_projection's inputs when they
    train, both GELUs' inputs, perception_emb_norm's fp32 copy and its [rows, 1] tensors, the adapters' own."""
    rows, p = n // v.merge_unit, v.projector_hidden
    indices = 2 * INT64 * n
    post = layer_norm_saved(v.hidden_size, prec, frozen=True) * n
    linears = prec.act * rows * ((v.merged_width + 4 * p) if trained else 2 * p)
    norm = (FP32 * v.out_hidden_size + NORM_ROW) * rows
    return (indices + post + linears + norm
            + adapters_saved([x for x in adapted if x.part == "merger"], rows, prec, lora))


def muse_glimmer_terms(job: JobSpec, prec: Precision, lora: LoraLayout) -> VisionTerms:
    v: MuseGlimmerTowerSpec = job.model.vision
    images, n = image_rows(job)
    adapted, _, weights = tower_weights(job, v, prec, lora)      # Muse Spark's audio tower and adapters load too
    if images == 0:
        return unused_tower(weights)
    trained, gc = not lora.enabled, job.train.gradient_checkpointing
    h = v.hidden_size
    tokens = n // v.merge_unit
    pixels = n * v.patch_dim * FP32
    if lora.enabled and not adapted and not gc:
        return graphless_tower(weights=weights, pixels=pixels, patches=n, image_tokens=tokens)
    # Muse Spark's audio tower (`idle_params`, its Linears part "idle") loads and gets no gradient: tower_states
    # leaves it out of the gradients and optimizer states, trained or adapted
    st = tower_states(job, v, prec, lora, adapted)
    gbytes, layer_adapters, per_block, rest, grads, opt = st.gbytes, st.layer_adapters, st.per_block, st.rest, \
        st.grads, st.opt
    # ln_pre's fp32 output under autocast: the layers' residual stream (their checkpointed inputs, their hidden-state
    # gradients) is fp32
    res = replace(prec, residual=FP32) if prec.amp else prec
    # the layers: q/k/v three Linears (Kimi_K25VisionAttention's); each window or image one chunk of the cu_seqlens
    # attention, whose outputs' concatenation proj keeps (block_saved's `proj_in`)
    spec = replace(block_spec(v), fused_qkv=False)
    mb = MicroBatch(rows=images, seq=n // images, label_tokens=0, padding_free=False, source="",
                    attn_implementation="sdpa")
    # norm1's output is fp32 under autocast (layer_norm runs in fp32) and q_proj, k_proj and v_proj each cast it to
    # 16 bits themselves, each cast kept for its weight gradient when it trains (block_saved's `qkv_casts`)
    full = block_saved(job, v, spec, mb, prec, v.block_params, tuple(adapted), lora)
    blocks = (res.residual * h * n,) * v.depth if gc else (full,) * v.depth
    rope = 2 * FP32 * (h // v.num_heads) * n
    leaves = token_leaf(job, prec) if not trained and gc else 0
    merger = merger_saved(v, n, prec, trained, adapted, lora)
    saved = sum(blocks) + embed_saved(v, n, prec, trained, adapted, lora) + rope + leaves + merger
    hidden_t, mlp_t, scores_t = act.backward_parts(spec, mb, res, "sdpa")
    adapter_t = n * max(x.in_features for x in layer_adapters) * backward_bytes_per_input(lora) \
        if layer_adapters else 0
    # alive until the trainer drops the model's outputs: last_hidden_state (pixel_shuffle's fp32 copy) and the
    # image features
    forward_only = res.residual * h * n + feature_locals(v, tokens, prec)
    what = ("tower, adapter and projection trained (full fine-tuning)" if trained else
            f"frozen; LoRA on {len(adapted)} of its linear kinds")
    return VisionTerms(weights=weights, gradients=grads, optimizer=opt, pixels=pixels, saved=saved,
                       merger_saved=merger, blocks_saved=blocks, block_full=full,
                       block_backward=hidden_t + max(mlp_t + adapter_t if gc else max(mlp_t, adapter_t), scores_t),
                       block_grads=per_block * gbytes, merger_grads=rest * gbytes, patches=n,
                       image_tokens=tokens, trained=what, forward_only=forward_only)

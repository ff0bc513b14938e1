"""Cosmos3 Edge's tower and patch merger in a vision-language job (hpcmem.models.cosmos3_edge), as
hpcmem.estimate.vision's `VisionTerms`, which `with_vision` places in the learned text part's phases
(hpcmem.models.vlm_learned).

How the step runs (transformers 5.24 models/cosmos3_edge/modeling_cosmos3_edge.py `Cosmos3EdgeModel.
get_image_features`, `Cosmos3EdgeVisionModel.forward`): pixel_values [N, 3 · 16²] fp32 (every patch of every image
one row) cast to the tower's dtype (`pixel_values.type(self.visual.dtype)`: a 16-bit copy, which `patch_embedding`,
an nn.Linear, keeps for its weight gradient when it trains) → `Cosmos3EdgeVisionEmbeddings`: patch_embedding plus the
16 × 16 position table resized bilinearly per image (`F.interpolate(..., antialias=True)`, whose backward keeps no
tensor; its permuted copies and `torch.cat` are transients) → the layers (`Cosmos3EdgeVisionEncoderLayer`,
Siglip2EncoderLayer's, a GradientCheckpointingLayer: under checkpointing its input alone; else SigLIP's shape:
layer_norm1, q/k/v_proj as three Linears, SDPA per image on the cu_seqlens splits whose outputs' `torch.cat` out_proj
keeps, layer_norm2, fc1, gelu_pytorch_tanh, fc2: hpcmem.estimate.vision `block_saved`) → `post_layernorm` (its input
and statistics kept; its output, fp32 under autocast, is last_hidden_state) → `Cosmos3EdgePatchMerger` on that very
tensor: `norm` (a LayerNorm over the width: it keeps last_hidden_state as its input — no second copy — and its
statistics, and its output for linear_fc1 when that trains), viewed [N / 4, 4 · width], linear_fc1 (→ 11520) → GELU
(keeps its input) → linear_fc2 (keeps GELU's output when it trains) → split per image into `pooler_output`, whose
`torch.cat` masked_scatter reads (hpcmem.estimate.vision `feature_locals`). `Cosmos3EdgeModel.forward` (Qwen2VLModel's)
keeps the vision outputs in `mm_encoder_outputs` and returns them (`image_outputs`) until the trainer drops the model's
output: last_hidden_state stays alive as the merger norm's saved input anyway, and the split features as forward-only
locals.

Trained or frozen is what TRL and peft do: full fine-tuning trains the tower and the merger; LoRA all-linear adapts
every linear of the layers, patch_embedding and the merger's two (peft tuners_utils.py
`_maybe_include_all_linear_layers`). Cosmos3EdgeVisionModel names no input embeddings (no `_input_embed_layer`, no
`embed_tokens`), so under checkpointing with PEFT only the token embeddings' output is hooked
(`enable_input_require_grads`).
"""

from __future__ import annotations

from dataclasses import replace

from hpcmem.estimate import activations as act
from hpcmem.estimate.lora import LoraLayout, backward_bytes_per_input
from hpcmem.estimate.vision import (FP32, LAYER_NORM_STATS, VisionTerms, adapters_saved, block_saved, block_spec,
                                    feature_locals, graphless_tower, layer_norm_saved, token_leaf, tower_states,
                                    tower_weights, unused_tower)
from hpcmem.job.image_rules import image_rows
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import MicroBatch, Precision
from hpcmem.models.cosmos3_edge import Cosmos3EdgeTowerSpec


def merger_saved(v: Cosmos3EdgeTowerSpec, n: int, prec: Precision, trained: bool, adapted: list,
                 lora: LoraLayout) -> int:
    """post_layernorm over the N rows (its input and statistics: its output feeds a LayerNorm, not a linear) and the
    merger: `norm` over last_hidden_state (kept as its input: counted here once, with its statistics and, when
    linear_fc1 trains, its output), GELU's input [N / 4, projector_hidden], linear_fc2's input when it trains, the
    adapters' own."""
    h, rows = v.hidden_size, n // v.merge_unit
    post = layer_norm_saved(h, prec, frozen=True) * n
    last_hidden = (FP32 if prec.amp else prec.residual) * h * n
    norm = (LAYER_NORM_STATS + (0 if not trained else prec.act * h)) * n
    mlp = prec.act * v.projector_hidden * rows * (2 if trained else 1)
    return (post + last_hidden + norm + mlp
            + adapters_saved([x for x in adapted if x.part == "merger"], rows, prec, lora))


def cosmos3_edge_terms(job: JobSpec, prec: Precision, lora: LoraLayout) -> VisionTerms:
    v: Cosmos3EdgeTowerSpec = job.model.vision
    images, n = image_rows(job)
    adapted, _, weights = tower_weights(job, v, prec, lora)
    if images == 0:
        return unused_tower(weights)
    trained, gc = not lora.enabled, job.train.gradient_checkpointing
    h = v.hidden_size
    tokens = n // v.merge_unit
    pixels = n * v.patch_dim * FP32
    if lora.enabled and not adapted and not gc:
        return graphless_tower(weights=weights, pixels=pixels, patches=n, image_tokens=tokens)
    st = tower_states(job, v, prec, lora, adapted)
    gbytes, layer_adapters, per_block, rest, grads, opt = st.gbytes, st.layer_adapters, st.per_block, st.rest, \
        st.grads, st.opt
    # the layers: q/k/v three Linears (Siglip2Attention); each image one chunk of the cu_seqlens attention, whose
    # outputs' concatenation out_proj keeps (block_saved's `proj_in`)
    spec = replace(block_spec(v), fused_qkv=False)
    mb = MicroBatch(rows=images, seq=n // images, label_tokens=0, padding_free=False, source="",
                    attn_implementation="sdpa")
    full = block_saved(job, v, spec, mb, prec, v.block_params, tuple(adapted), lora)
    blocks = (prec.residual * h * n,) * v.depth if gc else (full,) * v.depth
    # before the layers: patch_embedding's 16-bit input copy when it trains, its adapter's own — without a dropout
    # mask: the adapter's input, the pixel rows' 16-bit copy, requires no grad, so its dropout records no autograd
    # node and keeps nothing (lora_A keeps its own input); under checkpointing with PEFT the token embeddings' hooked
    # output
    patch_in = n * v.patch_dim * prec.act if trained else 0
    embed_own = adapters_saved([x for x in adapted if x.part == "embed"], n, prec, replace(lora, dropout=False))
    leaves = token_leaf(job, prec) if not trained and gc else 0
    merger = merger_saved(v, n, prec, trained, adapted, lora)
    saved = sum(blocks) + patch_in + embed_own + leaves + merger
    hidden_t, mlp_t, scores_t = act.backward_parts(spec, mb, prec, "sdpa")
    adapter_t = n * max(x.in_features for x in layer_adapters) * backward_bytes_per_input(lora) \
        if layer_adapters else 0
    what = ("tower and merger trained (full fine-tuning)" if trained else
            f"frozen; LoRA on {len(adapted)} of its linear kinds")
    return VisionTerms(weights=weights, gradients=grads, optimizer=opt, pixels=pixels, saved=saved,
                       merger_saved=merger, blocks_saved=blocks, block_full=full,
                       block_backward=hidden_t + max(mlp_t + adapter_t if gc else max(mlp_t, adapter_t), scores_t),
                       block_grads=per_block * gbytes, merger_grads=rest * gbytes, patches=n,
                       image_tokens=tokens, trained=what, forward_only=feature_locals(v, tokens, prec))

"""Kimi K2.5's tower and multimodal projector in a vision-language job (hpcmem.models.kimi_k25), as
hpcmem.estimate.vision's `VisionTerms`, which `with_vision` places in the learned text part's phases
(hpcmem.models.vlm_learned).

How the step runs (transformers 5.24 models/kimi_k25/modeling_kimi_k25.py `Kimi_K25Model.get_image_features`,
`Kimi_K25VisionModel.forward`): pixel_values [N, 3, 14, 14] fp32 (every patch of every image one row) →
`Kimi_K25VisionPatchEmbed`: the Conv2d (autocast's bf16 copy of its input kept when it trains) viewed [N, width],
then `Kimi_K25VisionPositionEmbeddings`: `F.embedding_bag` over the 64 × 64 table with 16 bicubic taps a row (its
int64 indices and weights kept when the table trains) plus the fp32 time row (forward-only) → the axial rope's fp32
cos and sin [N, head_dim] (`Kimi_K25VisionRotaryEmbedding`, built once, which every layer's `q * cos` and
`rotate_half(q) * sin` keep: no copy per layer) → the layers (`Kimi_K25VisionEncoderLayer`, a
GradientCheckpointingLayer: under checkpointing its input alone; else SigLIP's shape: norm1, q/k/v_proj, the rope in
fp32 cast back, SDPA per image on the cu_seqlens splits with the chunks' `torch.cat` that proj keeps, norm2, fc1,
gelu_pytorch_tanh, fc2) → `final_layernorm` (fp32 under autocast; its output the model keeps as last_hidden_state)
→ `temporal_merge`: the rows in fp32 times the frame weight (which mul keeps: [N, 1]), `index_add_` into new fp32 zeros
(its int64 index [N] kept), cast back to the rows' dtype: fp32 under autocast, [N / 4, 4, width] →
`Kimi_K25MultimodalProjection`: `pre_norm` LayerNorm over each row (keeps that fp32 tensor), viewed [N / 4, 4 ·
width], in_proj (its bf16 input kept when it trains), GELU (keeps its input), out_proj (keeps GELU's output when it
trains) → the image tokens' embeddings (split, `torch.cat`, `masked_scatter`: hpcmem.estimate.vision
`feature_locals`). The model's output holds the tower's last_hidden_state and the split embeddings until the trainer
drops it before the backward.

Trained or frozen is what TRL and peft do: full fine-tuning trains all of it; LoRA all-linear adapts every linear of
the layers and the projector (peft tuners_utils.py `_maybe_include_all_linear_layers`). Kimi_K25VisionModel names no
input embeddings (no `embed_tokens`: `get_input_embeddings` raises NotImplementedError, which
`enable_input_require_grads` skips), so under checkpointing with PEFT only the token embeddings' output is hooked.
"""

from __future__ import annotations

from dataclasses import replace

from hpcmem.estimate import activations as act
from hpcmem.estimate.lora import LoraLayout, backward_bytes_per_input
from hpcmem.estimate.vision import (FP32, VisionTerms, adapters_saved, block_saved, block_spec, graphless_tower,
                                    layer_norm_saved, token_leaf, tower_states, tower_weights, unused_tower)
from hpcmem.job.image_rules import image_rows
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import MicroBatch, Precision
from hpcmem.models.kimi_k25 import MERGE, KimiK25TowerSpec

INT64 = 8
TAPS = 16       # bicubic interpolation: 4 × 4 table rows per patch (vision_utils.py
#                 `get_vision_interpolation_indices_and_weights`, mode "bicubic")


def _projector_saved(v: KimiK25TowerSpec, n: int, prec: Precision, trained: bool, adapted: list,
                     lora: LoraLayout) -> int:
    """final_layernorm (its output feeds the merge, not a linear) over the N rows, temporal_merge's int64 index and
    fp32 frame weights, and the projector on N / 4 rows: `pre_norm`'s input (the merged rows, fp32 under autocast, in
    the rows' dtype otherwise) and stats, in_proj's input when it trains, GELU's input, out_proj's input when it
    trains, its adapters' own."""
    h, rows = v.hidden_size, n // MERGE ** 2
    final = layer_norm_saved(h, prec, frozen=True) * n
    merge = (INT64 + FP32) * n
    pre = layer_norm_saved(h, prec, frozen=True) * n
    linears = prec.act * v.merged_width * rows * (3 if trained else 1)
    return (final + merge + pre + linears
            + adapters_saved([x for x in adapted if x.part == "merger"], rows, prec, lora))


def kimi_k25_terms(job: JobSpec, prec: Precision, lora: LoraLayout) -> VisionTerms:
    v: KimiK25TowerSpec = job.model.vision
    images, n = image_rows(job)
    adapted, _, weights = tower_weights(job, v, prec, lora)
    if images == 0:
        return unused_tower(weights)
    w, trained, gc = prec.weight, not lora.enabled, job.train.gradient_checkpointing
    h = v.hidden_size
    tokens = n // MERGE ** 2
    pixels = n * v.patch_dim * FP32
    if lora.enabled and not adapted and not gc:
        return graphless_tower(weights=weights, pixels=pixels, patches=n, image_tokens=tokens)
    st = tower_states(job, v, prec, lora, adapted)
    gbytes, layer_adapters, per_block, rest, grads, opt = st.gbytes, st.layer_adapters, st.per_block, st.rest, \
        st.grads, st.opt
    # the layers: q/k/v are three Linears; each image one chunk of the cu_seqlens attention, whose outputs'
    # concatenation proj keeps (block_saved's `proj_in`)
    spec = replace(block_spec(v), fused_qkv=False)
    mb = MicroBatch(rows=images, seq=n // images, label_tokens=0, padding_free=False, source="",
                    attn_implementation="sdpa")
    full = block_saved(job, v, spec, mb, prec, v.block_params, tuple(adapted), lora)
    blocks = (prec.residual * h * n,) * v.depth if gc else (full,) * v.depth
    # before the layers: the Conv2d's input (trained) and embedding_bag's indices and weights (the table trains);
    # the rope's fp32 cos and sin, which the layers' multiplications keep; under checkpointing with PEFT the token
    # embeddings' hooked output
    conv = (n * v.patch_dim * w + TAPS * (INT64 + w) * n) if trained else 0
    rope = 2 * FP32 * (h // v.num_heads) * n
    leaves = token_leaf(job, prec) if not trained and gc else 0
    merger_saved = _projector_saved(v, n, prec, trained, adapted, lora)
    saved = sum(blocks) + conv + rope + leaves + merger_saved
    hidden_t, mlp_t, scores_t = act.backward_parts(spec, mb, prec, "sdpa")
    adapter_t = n * max(x.in_features for x in layer_adapters) * backward_bytes_per_input(lora) \
        if layer_adapters else 0
    # alive until the trainer drops the model's outputs: last_hidden_state (final_layernorm's output) and the split
    # image embeddings
    forward_only = (FP32 if prec.amp else prec.residual) * h * n + prec.act * v.out_hidden_size * tokens
    what = ("tower and projector trained (full fine-tuning)" if trained else
            f"frozen; LoRA on {len(adapted)} of its linear kinds")
    return VisionTerms(weights=weights, gradients=grads, optimizer=opt, pixels=pixels, saved=saved,
                       merger_saved=merger_saved, blocks_saved=blocks, block_full=full,
                       block_backward=hidden_t + max(mlp_t + adapter_t if gc else max(mlp_t, adapter_t), scores_t),
                       block_grads=per_block * gbytes, merger_grads=rest * gbytes, patches=n,
                       image_tokens=tokens, trained=what, forward_only=forward_only)

"""MiniCPM-V 4.6's tower, window merger and MLP merger in a vision-language job (hpcmem.models.minicpmv4_6), as
hpcmem.estimate.vision's `VisionTerms`, which `with_vision` places in the learned text part's phases
(hpcmem.models.vlm_learned).

How the step runs (transformers 5.24 models/minicpmv4_6/modular_minicpmv4_6.py `MiniCPMV4_6Model.get_image_features`,
`MiniCPMV4_6VisionModel.forward`): pixel_values [1, 3, patch, N · patch] fp32 (every slice of every image packed in
one row; `forward` takes `pixel_values[:1]`) cast to the weight dtype → `MiniCPMV4_6VisionEmbeddings` (the Conv2d,
its input kept when it trains; the position table read at nearest int64 ids [N]) → layers 0 … insert_layer_id over
the N rows (SiglipEncoderLayer, a GradientCheckpointingLayer: under checkpointing its input alone; its attention
`MiniCPMV4_6VisionAttention` runs SDPA per slice on the cu_seqlens splits and `torch.cat`s the outputs, which
out_proj reads) → `MiniCPMV4_6ViTWindowAttentionMerger` (an nn.Module, never checkpointed): layer_norm1, the rows
gathered into 2 × 2 windows (`hidden_states[:, window_index, :]`, the int64 index [N] kept), the same attention per
window, the residual gathered and added, each window's rows flattened to [N / 4, 4 · width] → `pre_norm` → linear_1
(→ 4 · intermediate) → gelu_pytorch_tanh (keeps its input) → linear_2 (keeps GELU's output when it trains) plus the
window mean → the later layers over N / 4 rows → `post_layernorm` (its output feeds the merger's copy, not a linear)
→ `MiniCPMV4_6Merger` per slice: 2 × 2 blocks flattened (the permuted reshape's copy, [N / 16, 4 · width], which
`pre_norm` keeps) → `pre_norm` → linear_1 (4 · width → 4 · width) → GELU (keeps its input) → linear_2 (keeps GELU's
output when it trains) → the image tokens' embeddings (`masked_scatter`). The model's output holds the tower's output
(`image_outputs`: last_hidden_state and the merger's pooler_output) until the trainer drops it before the backward.

Trained or frozen is what TRL and peft do: full fine-tuning trains all of it (every layer is on the loss's path:
last_hidden_state is read after post_layernorm); LoRA all-linear adapts every linear of the layers, the window merger
and the MLP merger (peft tuners_utils.py `_maybe_include_all_linear_layers`). The tower names its patch embedding as
its input embeddings (`MiniCPMV4_6VisionPreTrainedModel._input_embed_layer = "patch_embedding"`), which
`enable_input_require_grads` hooks under checkpointing with PEFT.

At downsample_mode "4x" (MiniCPM-OCR's default) `get_image_features` passes `use_vit_merger=False`: every layer runs
the N rows, the window merger keeps nothing and gets no gradient (hpcmem.estimate.vision `tower_states` leaves its
parameters and adapters out of the gradients and optimizer states), and the MLP merger runs over N rows: N / 4 image
tokens.
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
from hpcmem.models.minicpmv4_6 import MERGE, MiniCpmV46TowerSpec

INT64 = 8


def _slices(job: JobSpec, v: MiniCpmV46TowerSpec, images: int) -> int:
    """The slices the tower's attention runs one by one (cu_seqlens): every image's source and grid slices."""
    return images * len(v.slices(job.train.image_height, job.train.image_width))


def _window_merger_saved(v: MiniCpmV46TowerSpec, n: int, prec: Precision, trained: bool, adapted: list,
                         lora: LoraLayout) -> int:
    """What `MiniCPMV4_6ViTWindowAttentionMerger` keeps over n rows: layer_norm1 (its output feeds q/k/v), the window
    gather's int64 index (twice: the normed rows and the residual), SDPA's q, k, v and output per window (its
    logsumexp negligible), the concatenation out_proj reads when it trains, `pre_norm` over [n / 4, 4 · width],
    GELU's input and linear_2's input when it trains, the adapters' own (attention's at n rows, the MLP's at n / 4)."""
    h, quarter = v.hidden_size, n // MERGE ** 2
    norm = layer_norm_saved(h, prec, frozen=not trained) * n + 2 * INT64 * n
    attention = 4 * prec.act * h * n + (prec.act * h * n if trained else 0)
    mlp = (layer_norm_saved(v.merged_width, prec, frozen=not trained) * quarter
           + prec.act * v.intermediate_size * MERGE ** 2 * quarter * (2 if trained else 1))
    own = (adapters_saved([x for x in adapted if x.name.startswith("vit_merger.self_attn")], n, prec, lora)
           + adapters_saved([x for x in adapted if x.name.startswith("vit_merger.linear")], quarter, prec, lora))
    return norm + attention + mlp + own


def _merger_saved(v: MiniCpmV46TowerSpec, n_late: int, prec: Precision, trained: bool, adapted: list,
                  lora: LoraLayout) -> int:
    """post_layernorm (its output feeds a copy) over the late rows and the MLP merger over a quarter of them:
    `pre_norm` over 4 · width, GELU's input, linear_2's input when it trains, its adapters' own."""
    rows = n_late // MERGE ** 2
    post = layer_norm_saved(v.hidden_size, prec, frozen=True) * n_late
    norm = layer_norm_saved(v.merged_width, prec, frozen=not trained) * rows
    return (post + norm + prec.act * v.merged_width * rows * (2 if trained else 1)
            + adapters_saved([x for x in adapted if x.part == "merger"], rows, prec, lora))


def minicpmv4_6_terms(job: JobSpec, prec: Precision, lora: LoraLayout) -> VisionTerms:
    v: MiniCpmV46TowerSpec = job.model.vision
    images, n = image_rows(job)
    adapted, _, weights = tower_weights(job, v, prec, lora)
    if images == 0:
        return unused_tower(weights)
    w, trained, gc = prec.weight, not lora.enabled, job.train.gradient_checkpointing
    # the rows after the window merger (a quarter), or all of them at downsample_mode "4x" (it does not run)
    h, late = v.hidden_size, n // MERGE ** 2 if v.window_merger else n
    tokens = late // MERGE ** 2
    pixels = n * v.patch_dim * FP32
    if lora.enabled and not adapted and not gc:
        return graphless_tower(weights=weights, pixels=pixels, patches=n, image_tokens=tokens)
    st = tower_states(job, v, prec, lora, adapted)
    gbytes, layer_adapters, per_block, rest, grads, opt = st.gbytes, st.layer_adapters, st.per_block, st.rest, \
        st.grads, st.opt
    # the layers: SigLIP's q/k/v are three Linears; each slice one chunk of the cu_seqlens attention, whose outputs'
    # concatenation out_proj keeps (block_saved's `proj_in`, as the Qwen towers' `proj`)
    spec = replace(block_spec(v), fused_qkv=False)
    chunks = _slices(job, v, images)
    mbs = [MicroBatch(rows=chunks, seq=rows // chunks, label_tokens=0, padding_free=False, source="",
                      attn_implementation="sdpa") for rows in (n, late)]
    full = [block_saved(job, v, spec, mb, prec, v.block_params, tuple(adapted), lora) for mb in mbs]
    early = v.early_layers
    if gc:      # SiglipEncoderLayer is a GradientCheckpointingLayer: its input alone
        blocks = (prec.residual * h * n,) * early + (prec.residual * h * late,) * (v.depth - early)
    else:
        blocks = (full[0],) * early + (full[1],) * (v.depth - early)
    # before the layers: the Conv2d's input (trained), the nearest position ids; frozen under checkpointing, the
    # hooked patch embedding's output and the token embeddings' output are leaves
    conv = n * v.patch_dim * w + INT64 * n if trained else 0
    hooked = not trained and gc
    leaves = n * h * w + token_leaf(job, prec) if hooked else 0
    window = _window_merger_saved(v, n, prec, trained, adapted, lora) if v.window_merger else 0
    merger_saved = _merger_saved(v, late, prec, trained, adapted, lora)
    saved = sum(blocks) + conv + leaves + window + merger_saved
    hidden_t, mlp_t, scores_t = act.backward_parts(spec, mbs[0], prec, "sdpa")
    adapter_t = n * max(x.in_features for x in layer_adapters) * backward_bytes_per_input(lora) \
        if layer_adapters else 0
    # alive until the trainer drops the model's outputs: last_hidden_state (post_layernorm's output) and the merger's
    # output rows
    forward_only = (FP32 if prec.amp else prec.residual) * h * late + prec.act * v.out_hidden_size * tokens
    idle = "" if v.window_merger else "; the window merger loaded and idle (downsample_mode 4x: no gradient)"
    what = ("tower, window merger and merger trained (full fine-tuning)" if trained and v.window_merger else
            "tower and merger trained (full fine-tuning)" if trained else
            f"frozen; LoRA on {len(adapted)} of its linear kinds") + idle
    return VisionTerms(weights=weights, gradients=grads, optimizer=opt, pixels=pixels, saved=saved,
                       merger_saved=merger_saved, blocks_saved=blocks, block_full=full[0],
                       block_backward=hidden_t + max(mlp_t + adapter_t if gc else max(mlp_t, adapter_t), scores_t),
                       block_grads=per_block * gbytes, merger_grads=rest * gbytes, patches=n,
                       image_tokens=tokens, trained=what, forward_only=forward_only)

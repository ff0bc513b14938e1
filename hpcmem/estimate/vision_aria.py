"""Aria's tower and projector in a vision-language job (hpcmem.models.aria): Idefics3's SigLIP-layer terms
(hpcmem.estimate.vision_idefics3 `idefics3_terms`) with Aria's batch and projector (`connector`).

How the step runs (transformers 5.24 models/aria/modular_aria.py `AriaModel.get_image_features`,
`AriaProjector.forward`, `AriaCrossAttention.forward`; torch/nn/functional.py `multi_head_attention_forward`): the
patch mask (`_create_patch_attention_mask`, any real pixel in a patch) → `Idefics3VisionTransformer` over every
image's max_image_size² square (a [images, 1, P, P] bool mask from `create_bidirectional_mask` when the image was
padded) → `hidden_states[-1]` (the last layer's output, before post_layernorm) → the projector: `query[:Q]` repeated
per image → layer_norm → q_proj; layer_norm_kv(patches) → k_proj, v_proj; `nn.MultiheadAttention` (need_weights
True, its default, so the explicit path: in_proj of q, k, v; q scaled; `baddbmm` with the [images · heads, Q, P] float
mask `_canonical_mask` makes of the bool one; softmax; `bmm` with v; out_proj) → `linear` → layer_norm →
linear_in → gelu_new (activations.py `NewGELUActivation`: pow, tanh and products in Python) → linear_out. On n patch
rows of width h, P patches and Q queries an image, H heads and the text width t, under autocast (LayerNorm, softmax
and pow fp32 ops; baddbmm, bmm and linear in the compute dtype):

- layer_norm_kv keeps its fp32 upcast input and stats; k_proj and v_proj each their own cast of its output when they
  train (an activation's cast is not cached); q's LayerNorm over the queries likewise when the queries train (frozen,
  `query` needs no grad and the query path keeps nothing but its q_proj adapter's);
- MultiheadAttention: its in-projections' inputs when in_proj_weight trains, q scaled and k (baddbmm's), softmax's
  fp32 [images · H, Q, P] output, bmm's compute-dtype cast of it and v, out_proj's input when it trains (peft's
  all-linear wraps out_proj, but `multi_head_attention_forward` reads `out_proj.weight` itself: the adapter never
  runs, so it keeps nothing);
- `linear`'s input, layer_norm's upcast input, stats and cast output, gelu_new's fp32 pow input, tanh output,
  0.5 · x and 1 + tanh, linear_out's input (each linear's when it trains; adapters their own).

What the forward holds beyond the saved tensors until the model's outputs are dropped, before the backward
(`AriaModelOutputWithPast.image_outputs`): the tower's hidden_states tuple (the embeddings' and every layer's
output) and post_layernorm's fp32 output with its saved tensors (its output is off the loss's path).
"""

from __future__ import annotations

from dataclasses import replace

from hpcmem.estimate.lora import LoraLayout
from hpcmem.estimate.vision import FP32, LAYER_NORM_STATS, VisionTerms, adapters_saved, layer_norm_saved, \
    vision_adapters
from hpcmem.estimate.vision_idefics3 import Connector, idefics3_terms
from hpcmem.job.image_rules import image_rows
from hpcmem.job.images import image_geometry
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import Precision
from hpcmem.models.aria import AriaTowerSpec

PREFIX = "multi_modal_projector."


def _padded(job: JobSpec) -> bool:
    """Whether the processor pads the image (its patch mask then not all real: a 4-D mask in the tower)."""
    v: AriaTowerSpec = job.model.vision
    return v.real_patches(job.train.image_height, job.train.image_width) < v.patches


def connector(job: JobSpec, prec: Precision, lora: LoraLayout) -> tuple[Connector, int]:
    """Aria's Connector and the bytes its forward holds until the model's outputs are dropped."""
    v: AriaTowerSpec = job.model.vision
    images, n = image_rows(job)
    frozen, a, w, res = lora.enabled, prec.act, prec.weight, prec.residual
    up = FP32 if prec.amp else res
    h, t, heads = v.hidden_size, v.out_hidden_size, v.num_heads
    q = images * image_geometry(job.train, v).tokens       # query rows, every image's
    scores = images * heads * v.tokens_per_tile * v.patches   # [images · H, Q, P]
    # the batch: pixel_values fp32 [images, 3, S, S] and pixel_mask, a bool per pixel (AriaImageProcessorPil)
    pixels = n * v.patch_dim * FP32 + images * v.tile ** 2
    conv = 0 if frozen else n * v.patch_dim * w
    # the tower's [images, 1, P, P] bool mask of a padded image (masking_utils.py `sdpa_mask`), held for every
    # layer's attention backward
    mask = images * v.patches ** 2 if _padded(job) else 0
    adapted = {x.name[len(PREFIX):]: x for x in vision_adapters(job, v) if x.part == "merger"} if frozen else {}

    def own(names: tuple[str, ...], rows: int) -> int:
        return sum(adapters_saved([adapted[k]], rows, prec, lora) for k in names if k in adapted)
    query = 0 if frozen else layer_norm_saved(h, prec, False) * q
    kv = (up * h + LAYER_NORM_STATS + (0 if frozen else 2 * a * h)) * n
    in_proj = 0 if frozen else a * h * (q + 2 * n)
    attention = a * h * (q + n) + (FP32 if prec.amp else a) * scores + a * scores + a * h * n
    out = 0 if frozen else 2 * a * h * q                   # out_proj's input and `linear`'s
    norm = layer_norm_saved(h, prec, frozen) * q
    gelu = ((3 * FP32 + a) if prec.amp else 4 * a) * t * q + (0 if frozen else a * t * q)
    adapters = own(("cross_attn.q_proj", "cross_attn.linear", "feed_forward.linear_in", "feed_forward.linear_out"),
                   q) + own(("cross_attn.k_proj", "cross_attn.v_proj"), n)
    saved = mask + query + kv + in_proj + attention + out + norm + gelu + adapters
    trainable = v.merger_params if not frozen else sum(
        job.train.lora_r * (x.in_features + x.out_features) * x.count for x in adapted.values())
    # held by the model's outputs through the forward: post_layernorm's saved tensors and fp32 output, the hidden
    # states tuple — under checkpointing the layers' inputs are the checkpoints' (counted), the last layer's output
    # is not; without, every layer's output and the embeddings' (a LayerNorm under autocast keeps its fp32 upcast)
    post = (up * h + LAYER_NORM_STATS + up * h) * n
    states = (1 if job.train.gradient_checkpointing else v.depth + 1) * res * h * n
    held = post + states
    # the backward's worst instant in the attention: the [images · H, Q, P] gradient from bmm, its fp32 cast and
    # softmax's fp32 input gradient, beside the projector's saved tensors
    backward = saved + (a + 2 * FP32) * scores
    # the forward's at softmax: the float mask, baddbmm's output and its fp32 upcast beside what is saved so far
    forward = saved + (2 * a + FP32) * scores
    # a no-grad pass (DPO's reference): the held outputs and the attention's mask, scores, fp32 softmax, its cast
    reference = post - (up * h + LAYER_NORM_STATS) * n + (v.depth + 1) * res * h * n + (2 * a + 2 * FP32) * scores
    return Connector(pixels=pixels, conv=conv, saved=saved, trainable=trainable, backward=backward, forward=forward,
                     reference=reference), held


def aria_terms(job: JobSpec, prec: Precision, lora: LoraLayout) -> VisionTerms:
    """Idefics3's tower terms with Aria's batch and projector (`connector`); post_layernorm's saved tensors, which
    idefics3_terms keeps to the backward, are held by the outputs through the forward only. A job without images only
    its weights."""
    if image_rows(job)[0] == 0:
        return idefics3_terms(job, prec, lora)
    conn, held = connector(job, prec, lora)
    terms = idefics3_terms(job, prec, lora, conn)
    v = job.model.vision
    post = layer_norm_saved(v.hidden_size, prec, lora.enabled) * terms.patches
    return replace(terms, saved=terms.saved - post, merger_saved=terms.merger_saved - post, forward_only=held)

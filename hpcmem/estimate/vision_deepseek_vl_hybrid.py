"""DeepSeek-VL hybrid's two towers and aligner in a vision-language job (hpcmem.models.deepseek_vl_hybrid), as
hpcmem.estimate.vision's `VisionTerms`: DeepSeek-VL's SigLIP terms (hpcmem.estimate.vision_idefics3, the aligner's
GELU and proj inputs alike) with the SAM tower's beside them.

How the step runs (transformers 5.24 models/deepseek_vl_hybrid/modular_deepseek_vl_hybrid.py
`DeepseekVLHybridModel.get_image_features`): SigLIP over pixel_values first, then SAM over high_res_pixel_values
(fp32 [B, 3, S, S], alive the whole step) → `SamPatchEmbeddings` (a Conv2d; its input cast to bf16 and kept when it
trains) + the position table → each `SamVisionLayer` (models/sam/modeling_sam.py; a GradientCheckpointingLayer: under
checkpointing its input alone) → `SamVisionNeck` → `DeepseekVLSamVisionProj`; the hidden state after layer
global_attn_indexes[0] through the second neck and the same projection, times high_res_vision_alpha, added →
permute + reshape (a copy, high_res_vision_proj's input) → the aligner. SAM's nodes are the later ones, so its backward
runs before SigLIP's (autograd's ready queue takes the higher sequence number first): `blocks_saved` lists SigLIP's
blocks, then SAM's, and the necks and projections go with the merger (their backward runs before any block's).

One SamVisionLayer (`SamVisionLayer.forward`, `SamVisionSdpaAttention.forward`), over N = B · G² rows and L attention
rows (N for a global layer, B · windows · window² for a windowed one: `window_partition` pads the grid to a multiple
of the window and copies it into windows). What it keeps (read on the layer itself under torch's saved-tensor hooks,
trained and frozen, windowed and global):
- layer_norm1 and layer_norm2: `layer_norm_saved` (fp32 under the trace's CUDA-autocast layer norm);
- qkv's input (the windows or layer_norm1's output, cast) when qkv trains;
- `get_decomposed_rel_pos`: two einsums over the query (`bhwc,hkc->bhwk`): with trainable rel_pos each keeps a query
  layout, which is one [L, width] copy each where the qkv reshape is a view (one image, global: B · heads merges), else
  the qkv reshape's copy [L, 3 · width] for one and a [L, width] copy for the other; the [S, S, head_dim] tables (and
  int64 indices when rel_pos trains);
- SDPA with the decomposed relative positions as a float mask that requires grad: the CPU takes the math path
  (attention.cpp `_scaled_dot_product_attention_math`: q, k, v upcast to fp32 and scaled, scores + mask, softmax), which
  keeps fp32 q, k, v and the fp32 probabilities [B · windows, heads, rows, rows] — the trace's; CUDA's
  memory-efficient attention would take the mask with its gradient and keep no probabilities (hpcmem/trace/kernels.py
  does not remap this call: the estimate follows the trace);
- proj's input (the attention output's permuted copy) when proj trains; lin1's input (layer_norm2's output, cast)
  when it trains, GELU's input, lin2's input when it trains; peft's adapters' own (qkv and proj at L rows, lin1 and lin2
  at N).
Its backward's widest instant is the softmax's: the gradient of the probabilities and softmax's output, both fp32
[.., rows, rows], beside the arriving gradient and its fp32 copy, once the MLP's and layer_norm2's saved tensors are
freed (traced: the step's peak at SAM's global layer).

Trained or frozen is what TRL and peft do: full fine-tuning trains both towers, the necks, the projection, alpha and
the aligner; LoRA all-linear adapts every SigLIP and SAM linear and the aligner's three, the convolutions and norms
frozen. Under LoRA the first SAM layer's input requires no grad (frozen patch embedding, no hook on it): its
layer_norm1 keeps nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hpcmem.estimate.lora import LoraLayout
from hpcmem.estimate.states import optimizer_bytes_per_param
from hpcmem.estimate.vision import FP32, VisionTerms, adapters_saved, layer_norm_saved, vision_adapters
from hpcmem.estimate.vision_idefics3 import idefics3_terms
from hpcmem.job.image_rules import image_rows
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import Precision
from hpcmem.models.deepseek_vl_hybrid import DeepseekVLHybridTowerSpec

INT64 = 8


@dataclass(frozen=True)
class SamLayer:
    """One SAM layer's bytes: what it keeps, of that what its attention keeps (the rest is freed when the backward
    reaches the softmax), its backward's widest instant beyond what it keeps, its forward's widest instant beyond the
    earlier layers' saved tensors (with grad), and its no-grad pass's widest instant (DPO's reference forward)."""

    full: int
    attention: int
    backward: int
    forward: int
    no_grad: int


def sam_layer(v: DeepseekVLHybridTowerSpec, i: int, images: int, prec: Precision, trained: bool, adapted: list,
           lora: LoraLayout) -> SamLayer:
    """SAM layer i over `images` images."""
    h, heads, g = v.sam_hidden, v.sam_heads, v.sam_grid
    n = images * g * g
    glob = v.sam_global(i)
    side = g if glob else v.window_size
    batch = images if glob else images * v.sam_windows          # the attention's batch of windows
    rows = batch * side * side                                   # L
    squares = batch * heads * (side * side) ** 2                 # the probabilities' elements
    hd = h // heads
    ln = layer_norm_saved(h, prec, frozen=True) * n
    first_frozen = not trained and i == 0
    attention = (0 if first_frozen else ln)
    if trained:
        attention += prec.act * h * rows                            # qkv's input
        if v.use_rel_pos:
            attention += (2 * prec.act * h * rows if batch == 1 else 4 * prec.act * h * rows) \
                + 2 * INT64 * side * side                           # the einsums' query layouts, the indices
    if v.use_rel_pos:
        attention += 2 * prec.act * side * side * hd                # the relative-position tables
    attention += 3 * FP32 * h * rows + FP32 * squares               # the math path's fp32 q, k, v, probabilities
    own = [x for x in adapted if x.part == "sam"]
    attention += adapters_saved([x for x in own if x.name.startswith("attn.")], rows, prec, lora)
    mlp = ln + prec.act * v.sam_mlp * n + (prec.act * (h * rows + h * n + v.sam_mlp * n) if trained else 0) \
        + adapters_saved([x for x in own if x.name.startswith("mlp.")], n, prec, lora)
    softmax = 2 * FP32 * squares + (prec.act + FP32) * h * rows - mlp
    mlp_backward = 2 * prec.act * v.sam_mlp * n + prec.act * h * n
    # the forward at the math path's softmax: the mask (attn_bias, bf16, held by SamVisionSdpaAttention.forward's
    # local), the scores plus mask and softmax's output (fp32; the probabilities counted with `attention`), beside
    # the layer's input, layer_norm1's fp32 output and qkv's output [L, 3 · width] that the locals hold
    live = (prec.act + FP32) * h * n + 3 * prec.act * h * rows
    forward = attention + (prec.act + FP32) * squares + live
    # no grad (DPO's reference): the mask requires no grad and the CPU's flash kernel takes it (no probabilities); the
    # widest instant is `decomposed_rel_pos.reshape(batch, heads, L, L)` in SamVisionSdpaAttention.forward, which
    # copies the broadcast sum `rel_h[..., None] + rel_w[..., None, :]` (its layout is not that shape's) while the sum
    # is still held: two bf16 masks beside the same locals (traced: both allocations alive at the reference's peak)
    no_grad = 2 * prec.act * squares + live
    return SamLayer(full=attention + mlp, attention=attention, backward=max(softmax, mlp_backward), forward=forward,
                    no_grad=no_grad)


def _head_saved(v: DeepseekVLHybridTowerSpec, images: int, prec: Precision, trained: bool, gc: bool) -> int:
    """The two necks (SamVisionNeck, DeepseekVLSamVisionNeck: conv1 1×1, a channels-first LayerNorm, conv2 3×3, a
    LayerNorm) and the projection run on each (DeepseekVLSamVisionProj: bilinear interpolate to 4·O, conv1 and conv2
    3×3 stride 2): the LayerNorms' inputs and stats, and the convolutions' inputs (conv2's cast from the fp32 norm
    output, the projection's conv1 a bf16 copy of the interpolated fp32 map), trained or frozen: a convolution keeps
    its input and weight whenever any of them requires grad (torch's ConvolutionBackward0 saves both together; under
    LoRA the necks' inputs require grad through the layers' adapters). The second neck's conv1 reads layer
    global_attn_indexes[0]'s output: the checkpoint input of the next layer under checkpointing (no extra bytes).
    When alpha and the aligner train, `* high_res_vision_alpha` keeps the global branch's projection and
    high_res_vision_proj keeps its input (the permuted copy [B · O², 4C])."""
    c, n, o = v.sam_channels, images * v.sam_grid ** 2, v.output_size
    norms = 2 * 2 * layer_norm_saved(c, prec, frozen=True) * n
    necks = prec.act * v.sam_hidden * n * (1 if gc else 2) + 2 * prec.act * c * n
    proj = 2 * prec.act * images * (c * (4 * o) ** 2 + 2 * c * (2 * o) ** 2)
    return norms + necks + proj + (2 * prec.act * images * v.merged_width * o * o if trained else 0)


def deepseek_vl_hybrid_terms(job: JobSpec, prec: Precision, lora: LoraLayout) -> VisionTerms:
    v: DeepseekVLHybridTowerSpec = job.model.vision
    base = idefics3_terms(job, prec, lora)      # SigLIP, the aligner, the weights of both towers (num_params)
    images, _ = image_rows(job)
    if images == 0:
        return base
    trained, gc, r = not lora.enabled, job.train.gradient_checkpointing, job.train.lora_r
    adapted = list(vision_adapters(job, v)) if lora.enabled else []
    pixels = images * v.sam_in_channels * v.sam_image_size ** 2 * FP32
    embed = images * v.sam_in_channels * v.sam_image_size ** 2 * prec.act if trained else 0
    if not base.blocks_saved:       # no graph (no adapter, no hook): SAM keeps nothing either
        return replace(base, pixels=base.pixels + pixels)
    gbytes = prec.weight if trained else lora.adapter_bytes
    sam = [x for x in adapted if x.part == "sam"]
    layers = [sam_layer(v, i, images, prec, trained, adapted, lora) for i in range(v.sam_depth)]
    rel = [2 * (2 * (v.sam_grid if v.sam_global(i) else v.window_size) - 1) * (v.sam_hidden // v.sam_heads)
           if v.use_rel_pos else 0 for i in range(v.sam_depth)]
    linear = sum(x.params // x.count for x in v.linears() if x.part == "sam")
    per_layer = [(linear + 4 * v.sam_hidden + rel[i]) if trained else
                 sum(r * (x.in_features + x.out_features) for x in sam) for i in range(v.sam_depth)]
    sam_params = v.sam_params if trained else sum(per_layer)
    head_params = (sam_params - sum(per_layer) - (v.sam_in_channels * v.sam_patch ** 2 * v.sam_hidden
                                                   + v.sam_hidden + v.sam_grid ** 2 * v.sam_hidden
                                                   * v.use_abs_pos)) if trained else 0
    grads = sam_params * gbytes
    opt = int(sam_params * optimizer_bytes_per_param(job.train.optim, gbytes))
    checkpoint = prec.residual * v.sam_hidden * images * v.sam_grid ** 2
    blocks = tuple(checkpoint for _ in layers) if gc else tuple(x.full for x in layers)
    # under checkpointing a block is recomputed whole before its backward (blocks_full); its backward's widest
    # instant is the softmax's, less the MLP's saved tensors freed by then, or the MLP's (`SamLayer.backward`)
    head = _head_saved(v, images, prec, trained, gc)
    siglip = len(base.blocks_saved)
    saved = base.saved + sum(blocks) + embed + head
    # the forward's widest instant in SAM layer k: everything SigLIP keeps, SAM's pixels and patch-embedding input, the
    # layers before k, and layer k's own at its softmax — as `block_forward`, bytes beyond every block's saved tensors
    # (hpcmem.estimate.vision `_forward_instant` adds them all); SigLIP's own instant (base.block_forward) comes before
    # any SAM tensor exists
    every = sum(base.blocks_saved) + sum(blocks)
    outside = saved - every - (base.merger_saved + head)
    sam_forward = max((base.saved + embed + sum(blocks[:k]) + layers[k].forward)
                      - (outside + every) for k in range(len(layers)))
    siglip_forward = base.block_forward - sum(blocks) - embed if base.block_forward else 0
    return replace(
        base, gradients=base.gradients + grads, optimizer=base.optimizer + opt, pixels=base.pixels + pixels,
        saved=saved, merger_saved=base.merger_saved + head,
        blocks_saved=(*base.blocks_saved, *blocks),
        blocks_full=(base.block_full,) * siglip + tuple(x.full for x in layers),
        blocks_backward=(base.block_backward,) * siglip + tuple(x.backward for x in layers),
        blocks_grads=(base.block_grads,) * siglip + tuple(p * gbytes for p in per_layer),
        merger_grads=base.merger_grads + head_params * gbytes,
        block_forward=max(sam_forward, siglip_forward),
        reference_pass=max(x.no_grad for x in layers),
        trained=base.trained.replace("tower and connector", "both towers and the aligner"))

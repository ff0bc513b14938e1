"""Granite 4 Vision's SigLIP tower and Window Q-Former projectors in a vision-language job
(hpcmem.models.granite4_vision), as hpcmem.estimate.vision's `VisionTerms`, which `with_vision` places in the learned
Granite text part's phases (hpcmem.models.vlm_learned).

How the step runs (transformers 5.24 models/granite4_vision/modular_granite4_vision.py): `get_image_features` runs
the SigLIP tower on every anyres tile (LLaVA-NeXT's tiles and base image, [T, 3, 384, 384] fp32) asking only for the
hidden states the projectors read (`select_hidden_states`: the deepstack taps and the spatial layer; `capture_outputs`
keeps those alone, alive until `Granite4VisionModel.forward` returns); the layers are SiglipEncoderLayers
(GradientCheckpointingLayer: under checkpointing their input alone), post_layernorm runs off the loss's path. Each
projector (`Granite4VisionWindowQFormerDownsampler.forward`) on the tap's n = T · side² rows:

- `norm` LayerNorm (an fp32 op under autocast: it keeps the fp32 upcast of its input and its statistics; its output
  is fp32); the layerwise projectors' `interpolate_downsample` (mode "area": adaptive_avg_pool2d, which keeps its
  input, a permuted view of that fp32 output) or the spatial ones' `spatial_offset_downsample` (a strided slice copied
  by `reshape`: keeps nothing), each `_windowed_raster` copy (transients);
- `query + downsampled_windowed` (fp32, r = n · q² / w² rows in windows of q² queries) and
  `dropout(windowed + image_positions)` (fp32, n rows; `projector_dropout` keeps its bool mask), which the Q-Former
  casts to bf16 (`encoder_hidden_states.to(query_embeds.dtype)`: the key and value linears' input);
- Blip2QFormerModel: the queries cast to bf16, `layernorm` (fp32 upcast and statistics), dropout (mask), then its one
  Blip2QFormerLayer (a GradientCheckpointingLayer: under checkpointing its two inputs alone — the dropout's fp32 output
  and the bf16 key/value rows): self-attention (query/key/value each cast their fp32 input to bf16 and keep it when
  they train; flash SDPA keeps q, k, v, out and its logsumexp), output.dense (reads SDPA's out) → dropout (mask) →
  LayerNorm over the fp32 sum with the residual (keeps that sum: no upcast copy, and its statistics); cross-attention
  over the window's w² key rows (key/value keep the bf16 encoder rows; SDPA keeps them too) likewise; the query MLP
  (intermediate cast, GELU's input, output_query.dense's input, dropout mask, LayerNorm);
- `_unwindowed_raster`'s contiguous copy, dropout (mask), `out_linear` (its bf16 cast input when it trains) → [r, o];
  `pack_image_features` (copies, concatenations: keep nothing) → the image's rows, concatenated again in
  `Granite4VisionModel.forward`; both alive until the model's outputs are dropped (the output returns
  `deepstack_features`).
- The text model (`Granite4VisionTextModel.forward`) adds each projector's rows to the image tokens' hidden states
  before its layer (`hidden_states[mask] + features`, masked_scatter: they keep the mask and the indices only).

The backward runs the text layers first; each projector's feature gradient [image tokens, o] waits in the
backward's input buffer until every text layer is done (the projectors' nodes were made before the text layers'),
then the projectors run their backward one by one (the last made first: the spatial ones), each handing its tap a
gradient that waits until the tower's backward reaches that layer (Granite-Docling's taps likewise,
hpcmem.estimate.vision_granite_docling).

Trained or frozen is what TRL and peft do: full fine-tuning trains everything; LoRA all-linear adapts the tower's
linears and every projector linear (peft tuners_utils.py `_maybe_include_all_linear_layers`). TRL's DPO
(`disable_dropout`) sets every nn.Dropout to p = 0, which keeps no mask (Dropout.cpp `dropout`: p = 0 returns the
input); the Q-Former's SDPA dropout is a float, not a module, and flash attention keeps only its philox state.
"""

from __future__ import annotations

from dataclasses import replace

from hpcmem.estimate import activations as act
from hpcmem.estimate.lora import LoraLayout, backward_bytes_per_input
from hpcmem.estimate.vision import (FP32, LAYER_NORM_STATS, VisionTerms, adapters_saved, block_saved, block_spec,
                                    graphless_tower, tower_states, tower_weights, unused_tower,
                                    vision_adapters)
from hpcmem.job.image_rules import image_rows
from hpcmem.job.images import image_geometry
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import MicroBatch, Precision
from hpcmem.models.granite4_vision import Q_HEAD, Granite4VisionTowerSpec

MASK = 1                    # native_dropout's bool mask, one byte an element (Dropout.cpp)
FLASH_ROWS, FLASH_DIM = 128, 32     # FlashAttention-2's backward rounds the sequence to 128 and the head dim to 32


def _round(x: int, m: int) -> int:
    return -(-x // m) * m


def projector_saved(job: JobSpec, v: Granite4VisionTowerSpec, n: int, prec: Precision, lora: LoraLayout,
                    layerwise: bool) -> int:
    """What one projector keeps for its backward over the tap's n rows (r query rows): the module docstring's terms,
    the Q-Former layer's only without checkpointing (else its two inputs), the adapters' own (the Q-Former layer's
    only without checkpointing)."""
    h, i, a = v.hidden_size, v.q_intermediate, prec.act
    frozen, gc = lora.enabled, job.train.gradient_checkpointing
    up = FP32 if prec.amp else prec.residual
    mask = 0 if job.train.disable_dropout or v.projector_dropout == 0 else MASK
    qmask = 0 if job.train.disable_dropout or v.q_dropout == 0 else MASK
    r = n * v.query_side ** 2 // v.window_side ** 2
    windows = n // v.window_side ** 2
    heads = v.hidden_size // Q_HEAD
    norm = (up * h + LAYER_NORM_STATS) * n + (up * h * n if layerwise else 0)
    encoder = mask * h * n
    q_norm = (up * h + LAYER_NORM_STATS) * r + qmask * h * r
    tail = mask * h * r + (0 if frozen else a * h * r)         # the dropout before out_linear, its cast input
    linears = v.linears()
    adapted = [x for x in linears if x.part == "merger"] if frozen else []
    key_value = [x for x in adapted if x.name.endswith(("crossattention.attention.key",
                                                        "crossattention.attention.value"))]
    inner = [x for x in adapted if x.name.startswith("qformer.") and x not in key_value]
    out = [x for x in adapted if x.name == "out_linear"]
    own_out = adapters_saved(out, r, prec, lora)
    if gc:
        # Blip2QFormerLayer checkpointed: its hidden input (the dropout's fp32 output) and the bf16 encoder rows
        layer = up * h * r + a * h * n
        return norm + encoder + q_norm + layer + tail + own_out
    lse = FP32 * windows * heads * v.query_side ** 2
    ln = (up * h + LAYER_NORM_STATS) * r                       # a LayerNorm over the fp32 residual sum
    self_attn = (0 if frozen else 3 * a * h * r) + 4 * a * h * r + lse + qmask * h * r + ln
    cross = (0 if frozen else a * h * r + a * h * n) + 2 * a * h * r + 2 * a * h * n + lse + qmask * h * r + ln
    mlp = (0 if frozen else a * h * r) + a * i * r * (1 if frozen else 2) + qmask * h * r + ln
    own = adapters_saved(inner, r, prec, lora) + adapters_saved(key_value, n, prec, lora)
    return norm + encoder + q_norm + self_attn + cross + mlp + tail + own + own_out


def projector_backward(job: JobSpec, v: Granite4VisionTowerSpec, n: int, prec: Precision, lora: LoraLayout) -> int:
    """One projector's backward beyond its saved tensors, at its widest instant: the Q-Former layer's recompute under
    checkpointing (its saved tensors without checkpointing, less what stays saved outside it), FlashAttention-2's
    backward workspace (fp32 softmax_d [windows, heads, q²↑128] and dq_accum [windows, q²↑128, heads, 64↑32]), and
    at `norm`'s backward the fp32 gradients of its output from the two rasters, its fp32 input gradient and the cast
    back to the tap's dtype (hpcmem.estimate.vision_granite_docling's merger LayerNorm likewise)."""
    h, a = v.hidden_size, prec.act
    heads = v.hidden_size // Q_HEAD
    windows = n // v.window_side ** 2
    rows = _round(v.query_side ** 2, FLASH_ROWS)
    workspace = FP32 * windows * heads * rows + FP32 * windows * rows * heads * _round(Q_HEAD, FLASH_DIM)
    recompute = 0
    if job.train.gradient_checkpointing:
        full = replace(job.train, gradient_checkpointing=False)
        whole = projector_saved(replace(job, train=full), v, n, prec, lora, layerwise=False)
        outside = projector_saved(job, v, n, prec, lora, layerwise=False)
        r = n * v.query_side ** 2 // v.window_side ** 2
        recompute = whole - outside + FP32 * h * r + a * h * n
    return max(recompute + workspace, (3 * FP32 + a) * h * n)


def _tap(v: Granite4VisionTowerSpec, k: int) -> int:
    """The hidden-state index projector k reads (the layerwise ones' pairs, then the spatial layer), counted from 0."""
    x = v.deepstack[k][0] if k < len(v.deepstack) else v.spatial_layer
    return x if x >= 0 else v.depth + 1 + x


def _backward_order(v: Granite4VisionTowerSpec) -> list[int]:
    """The projectors in the order their backward runs: the last made first (`Granite4VisionModel.get_image_features`
    runs the layerwise ones, then the spatial ones; autograd runs the ready node made last first)."""
    return list(reversed(range(v.projectors)))


def projector_grads(job: JobSpec, v: Granite4VisionTowerSpec, lora: LoraLayout, gbytes: int) -> int:
    """One projector's gradient bytes: all its parameters when it trains, else its adapters' r · (in + out) each."""
    if not lora.enabled:
        return v.projector_params * gbytes
    adapted = [x for x in vision_adapters(job, v) if x.part == "merger"]
    return sum(job.train.lora_r * (x.in_features + x.out_features) * x.count for x in adapted) // v.projectors * gbytes


def granite4_vision_terms(job: JobSpec, prec: Precision, lora: LoraLayout) -> VisionTerms:
    v: Granite4VisionTowerSpec = job.model.vision
    images, n = image_rows(job)
    adapted, _, weights = tower_weights(job, v, prec, lora)
    if images == 0:
        return unused_tower(weights)
    trained, gc = not lora.enabled, job.train.gradient_checkpointing
    h, o, a = v.hidden_size, v.out_hidden_size, prec.act
    tiles = n // v.patches
    pixels = tiles * v.tile_values * FP32
    tokens = images * image_geometry(job.train, v).tokens
    if lora.enabled and not adapted and not gc:
        return graphless_tower(weights=weights, pixels=pixels, patches=n, image_tokens=tokens)
    st = tower_states(job, v, prec, lora, adapted)
    # post_layernorm gets no gradient (its output, last_hidden_state, is never read): no gradient, no optimizer state
    unused = v.unused_params if trained else 0
    grads = st.grads - unused * st.gbytes
    opt = int(st.opt * (1 - unused / max(1, st.per_block * v.depth + st.rest))) if trained else st.opt
    # the layers: SigLIP's (q/k/v three Linears, SDPA over each tile's patches, out_proj reading SDPA's output)
    spec = replace(block_spec(v), fused_qkv=False)
    mb = MicroBatch(rows=tiles, seq=v.positions, label_tokens=0, padding_free=False, source="",
                    attn_implementation="sdpa")
    full = block_saved(job, v, spec, mb, prec, v.block_params, tuple(adapted), lora) - (a * h * n if trained else 0)
    layers = v.trained_layers
    blocks = (prec.residual * h * n,) * layers if gc else (full,) * layers
    # before the layers: the Conv2d's bf16 input when it trains; frozen under checkpointing, the hooked patch
    # embedding's output is a leaf (hpcmem.estimate.vision `outside_saved`). The token embeddings' hooked output is a
    # leaf too, but not beside a first-layer input of its own as for the Qwen towers: GraniteModel.forward multiplies
    # it by embedding_multiplier into a new tensor with or without images, so the learned text profile holds it already
    conv = tiles * v.tile_values * prec.weight if trained else 0
    leaves = n * h * prec.weight if not trained and gc else 0
    # the projectors; their features twice each in the forward (`pack_image_features`' rows and the model's
    # concatenation), forward-only; in the backward each one's gradient [image tokens, o] appears once the text
    # layers' backward has passed its layer (`injected_grads`: none at the last text layer's backward, all but the
    # first layer's at the first layer's) and waits for the projectors' backward (`worst` below)
    feature = a * o * tokens
    own = [projector_saved(job, v, n, prec, lora, layerwise=k < len(v.deepstack)) for k in range(v.projectors)]
    merger = sum(own)
    saved = sum(blocks) + conv + leaves + merger
    # the taps: the hidden states the projectors read, alive until the model's forward returns; a layer's output is
    # already the next layer's checkpointed input under checkpointing
    taps = {x if x > 0 else v.depth + 1 + x for x, _ in v.deepstack} | {
        v.spatial_layer if v.spatial_layer > 0 else v.depth + 1 + v.spatial_layer}
    kept = sum(1 for k in taps if not gc or k == v.depth) * prec.residual * h * n
    forward_only = 2 * v.projectors * feature + kept
    # the tower's backward: each tap below the last layer hands its gradient early (the projectors run first); it
    # waits beside the layers above it (counted at the last layer's, the worst)
    waiting = sum(1 for k in taps if k < v.depth) * prec.residual * h * n
    hidden_t, mlp_t, scores_t = act.backward_parts(spec, mb, prec, "sdpa")
    layer_adapters = st.layer_adapters
    adapter_t = n * max(x.in_features for x in layer_adapters) * backward_bytes_per_input(lora) \
        if layer_adapters else 0
    block_backward = hidden_t + max(mlp_t + adapter_t if gc else max(mlp_t, adapter_t), scores_t) + waiting
    # the projectors' backward, the last made first (`_backward_order`): at the k-th, the saved tensors and waiting
    # feature gradients of it and those after it, the gradients of it and those before it, their taps' gradients
    # (one per distinct tap) and its own backward; the phase adds every trainable part outside the blocks as the
    # connector's gradients (`merger_grads`), so the instant is given beyond them
    grad_each = [projector_grads(job, v, lora, st.gbytes)] * v.projectors
    order = _backward_order(v)
    back = projector_backward(job, v, n, prec, lora)
    worst = max(sum(own[j] + feature for j in order[k:]) + sum(grad_each[j] for j in order[:k + 1])
                + len({_tap(v, j) for j in order[:k + 1]}) * prec.residual * h * n + back
                for k in range(len(order)))
    connector = worst - st.rest * st.gbytes
    what = ("tower and projectors trained (full fine-tuning); post_layernorm gets no gradient" if trained else
            f"frozen; LoRA on {len(adapted)} of its linear kinds")
    return VisionTerms(weights=weights, gradients=grads, optimizer=opt, pixels=pixels, saved=saved,
                       merger_saved=merger, blocks_saved=blocks, block_full=full, block_backward=block_backward,
                       block_grads=st.per_block * st.gbytes, merger_grads=st.rest * st.gbytes, patches=n,
                       image_tokens=tokens, trained=what, forward_only=forward_only, connector_backward=connector,
                       injected_grads=tuple((t, feature) for t in v.targets))

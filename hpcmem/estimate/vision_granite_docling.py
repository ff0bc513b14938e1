"""Granite-Docling's tower and connector in a vision-language job (hpcmem.models.granite_docling): Idefics3's
SigLIP-layer terms (hpcmem.estimate.vision_idefics3 `idefics3_terms`) with Granite-Docling's batch and connector
(`connector`).

How the step runs (transformers 5.24 models/granite_docling/modular_granite_docling.py): `get_image_features` gathers
the real tiles (`pixel_values[pixel_attention_mask].to(self.dtype)`: the weight-dtype copy the Conv2d reads) and runs
`GraniteDoclingVisionModel.forward`: `encode` (the embeddings, the layers, the layer outputs at
`deepstack_visual_indexes` kept in a list, post_layernorm), then `GraniteDoclingConnector.forward`: ln_in →
the coarse `GraniteDoclingConnectorPath` (pixel_shuffle → projection → the 2-D position table added → each deepstack
merger over its tap's pixel_shuffle: LayerNorm(h · s²) → linear_1 → GELU → linear_2) → ln_mid → GELU → mlp_fc2 →
ln_out. The image features are scattered into the token embeddings (`masked_scatter`) and each deepstack feature is
added to the image tokens' rows after text layer i (`GraniteDoclingTextModel._deepstack_process`: a clone, an index,
an add and an index_put, which keep the [image tokens] indices only: not counted). On n patch rows of width h and
m = n / s² image-token rows of width o (the text width), under autocast (torch LayerNorm an fp32 op):

- ln_in keeps its input (post_layernorm's fp32 output) and its mean and rstd; pixel_shuffle's copy of its output is
  cast for `projection` (kept when it trains: idefics3_terms' post_layernorm term counts it, as for Idefics3's proj);
- each deepstack merger: its LayerNorm's fp32 upcast of the [m, h · s²] pixel_shuffle copy and its stats, its output
  cast for linear_1 (kept when it trains), GELU's input [m, o] and linear_2's input (when it trains);
- ln_mid's upcast input and stats, GELU's fp32 input (ln_mid's output), mlp_fc2's cast input (when it trains),
  ln_out's upcast input and stats; each deepstack feature's [m, o] output and its `torch.cat` copy, alive through the
  language model's forward (`deepstack_visual_embeds`);
- the LoRA adapters of the coarse path and mlp_fc2 their own (`adapters_saved`); the fine path's never run.
"""

from __future__ import annotations

from hpcmem.estimate.lora import LoraLayout
from hpcmem.estimate.vision import FP32, LAYER_NORM_STATS, adapters_saved, layer_norm_saved, vision_adapters
from hpcmem.estimate.vision_idefics3 import Connector, idefics3_terms
from hpcmem.estimate.vision import VisionTerms
from hpcmem.job.image_rules import image_rows
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import Precision
from hpcmem.models.granite_docling import GraniteDoclingTowerSpec


def connector(job: JobSpec, prec: Precision, lora: LoraLayout) -> Connector:
    v: GraniteDoclingTowerSpec = job.model.vision
    images, n = image_rows(job)
    frozen, a, w = lora.enabled, prec.act, prec.weight
    up = FP32 if prec.amp else prec.residual          # a LayerNorm's saved input under autocast (its fp32 upcast)
    h, o, s2, k = v.hidden_size, v.out_hidden_size, v.scale_factor ** 2, len(v.deepstack_layers)
    m = n // s2                                        # image-token rows (tiles · tokens_per_tile)
    tiles = n // v.patches
    # the batch: pixel_values fp32 [1, tiles, 3, tile, tile] and pixel_attention_mask, one bool per tile
    # (GraniteDoclingImageProcessorPil._preprocess `np.zeros(..., dtype=bool)`)
    pixels = n * v.patch_dim * FP32 + tiles
    conv = 0 if frozen else n * v.patch_dim * w
    ln_in = (up * h + LAYER_NORM_STATS) * n
    merger = layer_norm_saved(h * s2, prec, frozen) * m + a * o * m * (1 if frozen else 2)
    tail = (up * o + LAYER_NORM_STATS) * m + up * o * m + (0 if frozen else a * o * m) + \
        (up * o + LAYER_NORM_STATS) * m
    features = 2 * k * a * o * m
    adapted = [x for x in vision_adapters(job, v) if x.part == "merger"] if frozen else []
    own = sum(adapters_saved([x], m, prec, lora) * x.count for x in adapted)
    saved = ln_in + k * merger + tail + features + own
    trainable = v.merger_params if not frozen else sum(
        job.train.lora_r * (x.in_features + x.out_features) * x.count for x in adapted)
    # The connector's backward, after the language model's (its nodes were made before the text layers'): each
    # deepstack merger's LayerNorm backward on [m, h · s²] — the fp32 gradient from linear_1's cast, native
    # LayerNorm's fp32 input gradient and its cast back to the tap's dtype — beside the connector's saved tensors and
    # post_layernorm's (not yet reached)
    post = layer_norm_saved(h, prec, frozen) * n
    # Each tap's gradient, made by its merger's backward, waits in the backward's input buffer of that layer's output
    # until the layers above hand theirs (`GraniteDoclingVisionModel.encode` appends the layer's output itself to
    # `deepstack_hidden_states`): one [n, h] gradient per tap below the last layer beside every layer's backward
    # above it — counted beside the last layer's, the worst — and every tap's during the connector's backward
    # (traced on the cut at 896×672, LoRA with checkpointing: a tap at layer 0 alone keeps 19.5 MiB more at layer 1's
    # backward than a tap at layer 1 alone or no tap)
    tap_grad = prec.residual * h * n
    waiting = sum(1 for i in v.deepstack_layers if i < v.depth - 1) * tap_grad
    backward = post + saved + (2 * FP32 + a) * h * n + k * tap_grad
    # its forward's worst instant, before the language model's layers: post_layernorm's fp32 output (the tower's
    # last_hidden_state) and the k taps (the layers' outputs, `deepstack_hidden_states`) held, every saved tensor but
    # the last merger's, and at the last merger's LayerNorm pixel_shuffle's copy of its tap, its fp32 upcast and
    # fp32 output
    forward = post + FP32 * h * n + k * a * h * n + saved - features + (a + 2 * FP32) * h * n
    # a no-grad pass (DPO's reference forward): nothing saved; the tower's output, ln_in's, the taps and one merger's
    # LayerNorm (the shuffle copy, its upcast and output) alive together
    reference = 2 * FP32 * h * n + k * a * h * n + (a + 2 * FP32) * h * n
    return Connector(pixels=pixels, conv=conv, saved=saved, trainable=trainable, backward=backward, forward=forward,
                     reference=reference, waiting=waiting)


def granite_docling_terms(job: JobSpec, prec: Precision, lora: LoraLayout) -> VisionTerms:
    """Idefics3's tower terms with Granite-Docling's batch and connector (`connector`); a job without images only its
    weights."""
    if image_rows(job)[0] == 0:
        return idefics3_terms(job, prec, lora)
    return idefics3_terms(job, prec, lora, connector(job, prec, lora))

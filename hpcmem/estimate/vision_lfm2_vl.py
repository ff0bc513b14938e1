"""LFM2-VL's tower and projector in a vision-language SFT job (hpcmem.models.lfm2_vl): llava's terms
(hpcmem.estimate.vision_llava `llava_terms`: SigLIP layers over whole tiles, every layer on the loss's path) with
what LFM2-VL's padded tiles, embeddings, reading and projector keep instead, as hpcmem.estimate.vision's
`VisionTerms`, which `with_vision` places in the learned text part's phases (hpcmem.models.vlm_learned).

How the step runs (transformers 5.24 models/lfm2_vl/modeling_lfm2_vl.py `Lfm2VlModel.get_image_features`,
models/siglip2/modeling_siglip2.py `Siglip2VisionModel.forward`): pixel_values [tiles, P, 3 · patch²] fp32, every
tile padded to P = max_num_patches rows → `Siglip2VisionEmbeddings`: `patch_embedding` (an nn.Linear on the rows cast
to the weight dtype: its input kept when it trains, its adapter's own under LoRA) plus the position table resized to
each tile's grid (`resize_positional_embeddings`: a [tiles, P, num_patches] matrix of bilinear weights made from
spatial_shapes, matmul'd with the table in fp32 — under autocast a 16-bit matmul that keeps its cast of the weights
for the table's gradient when the table trains) → the padding mask (`create_bidirectional_mask`: a [tiles, 1, P, P]
boolean mask where some tile is padded, none otherwise) → `depth` Siglip2EncoderLayers (SigLIP's; with the mask,
SDPA keeps its additive bias per layer: hpcmem.estimate.vision `padding_mask_difference`; under checkpointing the
mask is an input of every checkpointed layer) → `post_layernorm` (on the loss's path; its output feeds a gather, not
a linear: `layer_norm_saved` frozen) → every tile's token slots gathered into one patch grid
(`last_hidden_state.reshape(-1, width)[patch_index]`: the int64 index [tiles · P] kept) →
`Lfm2VlMultiModalProjector` on all tiles · P / factor² slots, padding ones included: `pixel_unshuffle` (reshape and
permute copies; the last reshape's copy is what the LayerNorm keeps), `layer_norm` over 4 · width
(`layer_norm_saved`), linear_1 → GELU (keeps its input) → linear_2 (keeps GELU's output when it trains) → the
padding slots dropped by a boolean index (its [slots] mask kept) → `masked_scatter` into the text embeddings. The
model's output holds the tower's output (`image_outputs`: last_hidden_state and the projected pooler_output) until
the trainer drops it before the backward: forward-only bytes.
"""

from __future__ import annotations

from dataclasses import replace

from hpcmem.estimate.lora import LoraLayout
from hpcmem.estimate.states import optimizer_bytes_per_param
from hpcmem.estimate.vision import (FP32, VisionTerms, adapters_saved, layer_norm_saved, padding_mask_difference,
                                    vision_adapters)
from hpcmem.job.image_rules import image_rows
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import MicroBatch, Precision
from hpcmem.models.lfm2_vl import Lfm2VlTowerSpec

INT64 = 8


def lfm2_vl_terms(job: JobSpec, prec: Precision, lora: LoraLayout, base: VisionTerms) -> VisionTerms:
    """`base` (llava_terms of the same job) with LFM2-VL's padding mask, embeddings, post_layernorm and projector."""
    v: Lfm2VlTowerSpec = job.model.vision
    images, n = image_rows(job)
    if images == 0 or not base.blocks_saved:
        return base
    trained, gc = not lora.enabled, job.train.gradient_checkpointing
    h, p = v.hidden_size, v.patches
    tiles = n // p
    rows = n // v.scale_factor ** 2                  # the projector's slots
    padded = v.padded(job.train.image_height, job.train.image_width)
    adapted = vision_adapters(job, v) if lora.enabled else ()
    embed_adapters = [x for x in adapted if x.part == "embed"]
    merger_adapters = [x for x in adapted if x.part == "merger"]
    # the blocks: llava's at [tiles, P] (no mask: llava's keep no bias however many rows) with the padding mask's bias
    # where a tile is padded
    mb = MicroBatch(rows=tiles, seq=p, label_tokens=0, padding_free=False, source="", attn_implementation="sdpa")
    block = base.block_full + padding_mask_difference(prec, mb, padded) - padding_mask_difference(prec, mb, False)
    blocks = base.blocks_saved if gc else (block,) * len(base.blocks_saved)
    # before the layers: llava's patch-embedding input (trained) and hooked leaves are in `base.saved`; the hooked
    # patch embedding's output is no leaf where its adapter makes it; the adapter's own; the position weights' cast;
    # the boolean mask under checkpointing
    own_leaf = n * h * prec.weight if embed_adapters and gc else 0
    embed = adapters_saved(embed_adapters, n, prec, lora) - own_leaf
    position = (prec.act if prec.amp else FP32) * n * v.num_patches if trained else 0
    mask = tiles * p * p if padded and gc else 0
    # after them: post_layernorm (its output feeds the gather), the gather's index, the projector, the drop's mask
    post = layer_norm_saved(h, prec, frozen=True) * n + INT64 * n
    norm = layer_norm_saved(v.merged_width, prec, frozen=not trained) * rows if v.projector_norm else \
        (prec.act * v.merged_width * rows if trained else 0)
    merger_saved = (post + norm + prec.act * v.projector_hidden * rows * (2 if trained else 1)
                    + adapters_saved(merger_adapters, rows, prec, lora) + rows)
    saved = (base.saved - sum(base.blocks_saved) + sum(blocks) - base.merger_saved + merger_saved + embed
             + position + mask)
    # alive in the forward only, with the model's outputs (Lfm2VlModelOutputWithPast.image_outputs): the tower's
    # last_hidden_state (post_layernorm's output, fp32 under autocast, which the gather reads and nothing saves) and
    # pooler_output, the image tokens' rows the boolean index made (split views of one [tokens, text width] tensor)
    forward_only = (FP32 if prec.amp else prec.residual) * h * n + prec.act * v.out_hidden_size * base.image_tokens
    # the patch embedding's adapter trains beside llava's parts under LoRA
    gbytes = lora.adapter_bytes
    extra = sum(job.train.lora_r * (x.in_features + x.out_features) for x in embed_adapters)
    return replace(base, saved=saved, merger_saved=merger_saved, blocks_saved=blocks, block_full=block,
                   forward_only=base.forward_only + forward_only,
                   gradients=base.gradients + extra * gbytes,
                   optimizer=base.optimizer + int(extra * optimizer_bytes_per_param(job.train.optim, gbytes)))

"""MiniMax M3 VL's tower and projector in a vision-language job with images (hpcmem.models.minimax_m3_vl), as
hpcmem.estimate.vision_idefics3's CLIP/SigLIP-layer terms with MiniMax M3 VL's own outside the layers (`Connector`).

How the step runs (transformers 5.24 models/minimax_m3_vl/modeling_minimax_m3_vl.py `MiniMaxM3VLModel.
get_image_features`, `MiniMaxM3VLVisionModel.forward`): pixel_values [N, channels · 2 · patch²] fp32 → viewed
[N, channels, 2, patch, patch] and cast to the weight dtype (`MiniMaxM3VLVisionEmbeddings.forward`: the Conv3d's
input, kept for its weight gradient when it trains) → the rotary cos and sin (`MiniMaxM3VLVisionRotaryEmbedding.
forward`: [N, rotary_dim] each, cast to the embeddings' dtype, read by every layer's `apply_rotary_pos_emb_vision`, so
kept until the first layer's backward) → `pre_layrnorm` (its input and statistics kept when the tower trains; its
output, fp32 under autocast, is the residual stream, no linear's input) → `depth` CLIPEncoderLayers over [N, width]
(q/k/v/out_proj, SDPA per image over the cu_seqlens chunks, `torch.cat` for out_proj) → no post-layernorm → the
projector (`MiniMaxM3VLMultiModalProjector.forward`): `linear_1` over the N patch rows (its input, the last layer's
output cast to the compute dtype, kept when it trains) → GELU (its input kept) → `linear_2` (GELU's output kept when it trains) → the merge_size² rows
viewed as one ([N / 4, 4 · text width]: `merge_linear_1`'s input, kept when it trains) → `merge_linear_1` → GELU (its
input kept) → `merge_linear_2` (GELU's output kept when it trains) → the image tokens' embeddings (`masked_scatter`).
N patches, N / merge_size² image tokens.

Trained or frozen is what TRL and peft do: full fine-tuning trains the tower and the projector; LoRA "all-linear"
adapts every q/k/v/out_proj, fc1, fc2 and the four projector linears. The tower names no input embeddings
(hpcmem.models.minimax_m3_vl), so under checkpointing with PEFT only the token embeddings' output is hooked.
"""

from __future__ import annotations

from dataclasses import replace

from hpcmem.estimate.lora import LoraLayout
from hpcmem.estimate.vision import FP32, VisionTerms, adapters_saved, layer_norm_saved, tower_weights
from hpcmem.estimate.vision_idefics3 import Connector, idefics3_terms
from hpcmem.job.image_rules import image_rows
from hpcmem.job.images import image_geometry
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import Precision
from hpcmem.models.minimax_m3_vl import MiniMaxM3VlTowerSpec

PATCH_ROWS = ("linear_1", "linear_2")          # the projector's linears over the N patch rows (the rest: image tokens)


def minimax_m3_terms(job: JobSpec, prec: Precision, lora: LoraLayout) -> VisionTerms:
    """The shared CLIP/SigLIP-layer terms (`idefics3_terms`) with MiniMax M3 VL's batch, Conv3d input, rotary tables,
    pre-layernorm and projector."""
    images, n = image_rows(job)
    if images == 0:
        return idefics3_terms(job, prec, lora)
    terms = idefics3_terms(job, prec, lora, connector(job, prec, lora))
    if not (job.train.gradient_checkpointing and prec.amp and prec.residual < FP32):
        return terms
    # under autocast pre_layrnorm returns fp32 (CUDA autocast's fp32 policy for layer_norm, as the trace runs it:
    # hpcmem.trace.kernels_autocast), and each layer adds its 16-bit attention and MLP outputs to that fp32 stream
    # (`residual + hidden_states`): the input every checkpointed CLIPEncoderLayer keeps is fp32 [N, width], where
    # `idefics3_terms` counts the residual dtype
    extra = (FP32 - prec.residual) * job.model.vision.hidden_size * n
    return replace(terms, blocks_saved=tuple(b + extra for b in terms.blocks_saved),
                   saved=terms.saved + extra * len(terms.blocks_saved))


def projector_saved(v: MiniMaxM3VlTowerSpec, n: int, m: int, prec: Precision, trained: bool) -> int:
    """What the projector keeps beyond its adapters (see the module's docstring) over n patches and m image tokens:
    linear_1's input [n, width] and merge_linear_1's [m, merge² · text width] when they train, each GELU's input and,
    when the linear after it trains, its output ([n, projector width], [m, projector width])."""
    p, o = v.projector_hidden, v.out_hidden_size
    gelus = prec.act * p * (n + m) * (2 if trained else 1)
    inputs = prec.act * (v.hidden_size * n + v.merge_unit * o * m) if trained else 0
    return gelus + inputs


def connector(job: JobSpec, prec: Precision, lora: LoraLayout) -> Connector:
    """What the tower keeps outside its encoder layers: the batch, the Conv3d's input when it trains, the rotary
    tables, pre_layrnorm's saved tensors when it trains, and the projector's saved tensors and adapters'.

    `idefics3_terms` counts a post_layernorm before the connector (`layer_norm_saved` over the tower width, its output
    kept for a trained first linear); this tower has none, so that term is taken back here and the projector's own
    first-linear input counted in `projector_saved`."""
    v: MiniMaxM3VlTowerSpec = job.model.vision
    images, n = image_rows(job)
    m = images * image_geometry(job.train, v).tokens
    adapted, _, _ = tower_weights(job, v, prec, lora)
    trained = not lora.enabled
    merger = [x for x in adapted if x.part == "merger"]
    on_patches = [x for x in merger if x.name in PATCH_ROWS]
    on_tokens = [x for x in merger if x.name not in PATCH_ROWS]
    # cos and sin in the embeddings' dtype (`cos.to(x.dtype)`: the Conv3d's output cast to pre_layrnorm's weight dtype)
    rope = 2 * n * v.rotary_dim * prec.weight
    conv = n * v.patch_dim * prec.weight if trained else 0
    # pre_layrnorm keeps its input and statistics only when something before it trains (the Conv3d): frozen, its input
    # requires no grad and autograd records nothing
    pre = layer_norm_saved(v.hidden_size, prec, frozen=True) * n if trained else 0
    post = layer_norm_saved(v.hidden_size, prec, frozen=not trained) * n
    r = job.train.lora_r
    trainable = v.merger_params if trained else sum(r * (x.in_features + x.out_features) for x in merger)
    saved = projector_saved(v, n, m, prec, trained) + adapters_saved(on_patches, n, prec, lora) + \
        adapters_saved(on_tokens, m, prec, lora) + pre - post
    return Connector(pixels=n * v.patch_dim * FP32, conv=conv + rope, saved=saved, trainable=trainable, backward=0,
                     forward=0)

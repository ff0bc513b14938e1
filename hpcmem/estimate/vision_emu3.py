"""Emu3's image path in a vision-language job (hpcmem.models.emu3 `Emu3TowerSpec`): a VQ-VAE encoder whose argmin
ends the graph, the codes embedded by the text model's own token embedding; its terms as hpcmem.estimate.vision's
`VisionTerms`, which `with_vision` places in the learned Emu3 text part's phases (hpcmem.models.vlm_learned).

How the step runs (transformers 5.24 models/emu3/modeling_emu3.py `Emu3Model.forward`, `get_image_features`,
`Emu3VQVAE.encode`, `Emu3VQVAEEncoder.forward`): pixel_values [images, 3, H, W] fp32 are repeated
temporal_downsample_factor times (frames) and cast to the weights' dtype; `conv_in`, then per level num_res_blocks
`Emu3VQVAEResnetBlock`s (norm1 → swish → conv1 → norm2 → swish → conv2, plus the residual, through nin_shortcut where
the widths differ), an `Emu3VQVAEAttentionBlock` after each at the attention levels (GroupNorm, q/k/v_proj, SDPA,
out_proj, residual), a stride-2 `Emu3VQVAEEncoderConvDownsample` (F.pad then Conv2d) below the last level; the middle
block (res block, attention, res block); norm_out → swish → conv_out; the temporal Conv3d downsampling and res
blocks (on latent_channels: negligible), `quant_conv` and `Emu3VQVAEVectorQuantizer` (distances to every code,
argmin). Each code row gets the row-end id, `embed_tokens` embeds them and `masked_scatter` places them at the
<image> tokens; the language model runs on max_length embeddings as a text-only step does.

What that keeps (the rule CUDA autocast applies, as the trace maps it: conv/linear/SDPA in 16 bits; group_norm and
`**` in fp32, hpcmem.trace.kernels_autocast `group_norm_pow_fp32`):
- Nothing reaches the VQ-VAE's parameters through the argmin: no gradient, no optimizer state (part "idle"), yet its
  forward builds a graph wherever a parameter or an input requires grad — from conv_in on under full fine-tuning (every
  parameter requires grad), from the first adapted attention Linear under LoRA (peft's "all-linear" wraps the VQ-VAE's
  q/k/v/out_proj). That graph, never run backward, is alive as long as the encoder's output is: in
  `mm_encoder_outputs` (the VQ model's `last_hidden_state`), a local of Emu3Model.forward until it returns — through
  the language model's forward, not its backward (`forward_only`).
- Per norm → swish → conv unit of E elements (`unit`): the GroupNorm's fp32 copy of its 16-bit input (native_group_norm
  saves its input), the sigmoid's fp32 output (SigmoidBackward saves its result), the in-place `*=`'s copy of the
  fp32 pre-swish tensor (MulBackward of an in-place mul saves the original self: a clone), and the conv's 16-bit cast
  of its input (ConvolutionBackward saves its input whether or not the weight trains): 4 + 4 + 4 + 2 bytes.
- nin_shortcut keeps the block's 16-bit input; a downsample conv its padded input; conv_in the 16-bit pixels (full
  fine-tuning only: nothing else needs a gradient there).
- An attention block on E elements: the GroupNorm's fp32 input copy (when its input requires grad), each trained
  q/k/v_proj's 16-bit input (the autocast cast, folded to 2-D), SDPA's q, k, v, output and fp32 logsumexp (one head of
  1024: no flash on CUDA, memory-efficient attention saves the same; the trace's CPU flash likewise), out_proj's
  input (SDPA's output itself: one head, the transpose stays contiguous); a frozen base Linear keeps nothing of its
  input; a LoRA adapter keeps its dropout mask (when its input requires grad), lora_A's 16-bit input and lora_B's
  [rows, r] input.
- The quantizer's instant (`quantizer_peak`): 2 · x·codeᵀ in 16 bits beside the fp32 ‖x‖² + ‖e‖² and their fp32
  difference, [codes, codebook] each, at the end of the encoder (the whole graph alive).
- Outside the VQ-VAE: the image codes' embedding indices (int64, when embed_tokens trains) and masked_scatter's bool
  mask [rows, seq] (when the embeddings require grad), kept for the backward; under LoRA with checkpointing the
  hooked embed_tokens' output for the image codes is a leaf (`enable_input_require_grads` hooks every call of the
  input embeddings), alive beside them. Forward only: the image embeddings (`pooler_output`) and their concatenation.
- With no graph (the levels before the first adapter under LoRA, DPO's reference pass) the widest instant is a res
  block's norm2 (`nograd_peak`): its input (the residual), conv1's output, its fp32 copy and the norm's fp32 output,
  beside conv_in's output, which the encoder's forward holds through the down block (in-sample: added after the first
  trace, whose DPO LoRA reference passes held it).
"""

from __future__ import annotations

import math

from hpcmem.errors import SpecError
from hpcmem.estimate.lora import LORA_DROPOUT_MASK_BYTES, LoraLayout
from hpcmem.estimate.vision import FP32, VisionTerms, tower_states, tower_weights, unused_tower
from hpcmem.job.image_rules import image_rows
from hpcmem.job.images import image_geometry
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import Precision, micro_batch
from hpcmem.models.emu3 import Emu3TowerSpec

INDEX = 8               # int64 embedding indices


def _frames_out(tdf: int) -> int:
    """Frames after the temporal downsampling: each `Emu3VQVAETemporalDownsample` pads 2 in front (Emu3VQVAEConv3d)
    and convolves with kernel 4, stride 2."""
    t = tdf
    for _ in range(int(math.log2(tdf))):
        t = (t + 2 - 4) // 2 + 1
    return t


def encoder_graph(v: Emu3TowerSpec, images: int, h: int, w: int, prec: Precision, trained: bool,
                  lora: LoraLayout) -> int:
    """Bytes the encoder's graph keeps, walking Emu3VQVAEEncoder.forward (the module docstring); under LoRA from the
    first adapted attention on (levels before it build no graph)."""
    vq, act, n32 = v.vq, prec.act, FP32 if prec.amp else prec.act
    frames = images * vq["temporal_downsample_factor"]
    base, mult, blocks, attn = vq["base_channels"], list(vq["channel_multiplier"]), vq["num_res_blocks"], \
        set(vq["attn_resolutions"])
    heads, r = vq["num_attention_heads"], lora.r
    mask = LORA_DROPOUT_MASK_BYTES if lora.dropout else 0
    live = [trained]      # whether the graph has started

    def unit(elems: int) -> int:
        return (3 * n32 + act) * elems

    def resnet(cin: int, cout: int, pixels: int) -> int:
        if not live[0]:
            return 0
        return unit(frames * cin * pixels) + unit(frames * cout * pixels) + \
            (act * frames * cin * pixels if cin != cout else 0)

    def attention(c: int, pixels: int) -> int:
        rows, e = frames * pixels, frames * c * pixels
        sdpa = 4 * act * e + FP32 * frames * heads * pixels
        if trained:
            return n32 * e + 3 * act * e + sdpa + 0          # out_proj's input is SDPA's output
        if not live[0]:      # the first adapted attention: its input needs no gradient
            live[0] = True
            return 3 * (act * e + act * r * rows) + sdpa + (mask + act) * e + act * r * rows
        return n32 * e + 4 * ((mask + act) * e + act * r * rows) + sdpa

    ins = [1, *mult]
    height, width = h, w
    total = act * frames * vq["in_channels"] * h * w if trained else 0     # conv_in's input
    for i in range(len(mult)):
        pixels = height * width
        c = base * ins[i]
        for _ in range(blocks):
            total += resnet(c, base * mult[i], pixels)
            c = base * mult[i]
            if i in attn:
                total += attention(c, pixels)
        if i != len(mult) - 1:
            total += act * frames * c * (height + 1) * (width + 1) if live[0] else 0
            height, width = height // 2, width // 2
    top, pixels = base * mult[-1], height * width
    total += resnet(top, top, pixels) + attention(top, pixels) + resnet(top, top, pixels)
    total += unit(frames * top * pixels) if live[0] else 0       # norm_out, swish, conv_out
    return total


def quantizer_peak(v: Emu3TowerSpec, images: int, h: int, w: int, prec: Precision) -> int:
    """`Emu3VQVAEVectorQuantizer.forward`'s widest instant: distances = 2 · x·codeᵀ (16 bits), then ‖x‖² + ‖e‖² and
    that minus the distances (fp32: `**` and sum run in fp32 under autocast), [codes, codebook] each."""
    vq = v.vq
    codes = images * _frames_out(vq["temporal_downsample_factor"]) * (h // v.spatial_factor) * \
        (w // v.spatial_factor)
    n32 = FP32 if prec.amp else prec.act
    return (prec.act + 2 * n32) * codes * vq["codebook_size"]


def nograd_peak(v: Emu3TowerSpec, images: int, h: int, w: int, prec: Precision) -> int:
    """The encoder's widest instant with no graph: a res block's norm2 call holds the block's input (the residual),
    conv1's output, the norm's fp32 copy of it and its fp32 output; beside them conv_in's output, which
    Emu3VQVAEEncoder.forward's `hidden_states` holds until down_block returns (the first block's input itself), and
    the 16-bit pixels encode() keeps."""
    vq, act, n32 = v.vq, prec.act, FP32 if prec.amp else prec.act
    frames = images * vq["temporal_downsample_factor"]
    base, mult, blocks = vq["base_channels"], list(vq["channel_multiplier"]), vq["num_res_blocks"]
    conv_in = act * frames * base * h * w
    ins, worst, pixels = [1, *mult], 0, h * w
    for i in range(len(mult)):
        cin, cout = base * ins[i], base * mult[i]
        for j in range(blocks):
            held = conv_in if (i, j) != (0, 0) else 0
            worst = max(worst, held + frames * pixels * (act * cin + (act + 2 * n32) * cout))
            cin = cout
        pixels //= 4
    return worst + act * frames * vq["in_channels"] * h * w


def emu3_terms(job: JobSpec, prec: Precision, lora: LoraLayout) -> VisionTerms:
    v: Emu3TowerSpec = job.model.vision
    images, _ = image_rows(job)
    adapted, _, weights = tower_weights(job, v, prec, lora)
    states = tower_states(job, v, prec, lora, adapted)
    if images == 0:
        return unused_tower(weights)
    kinds = {x.name.rsplit(".", 1)[-1] for x in adapted}
    if adapted and kinds != {"q_proj", "k_proj", "v_proj", "out_proj"}:
        raise SpecError(f"lora_target_modules {list(job.train.lora_target_modules)!r} on emu3 wrap "
                        f"{', '.join(sorted(kinds))} of the VQ-VAE's attention Linears: the graph it then builds is "
                        "modelled for all four (all-linear) or none")
    g = image_geometry(job.train, v)
    h, w = g.resized
    trained = not lora.enabled
    tokens = images * g.tokens
    hidden, gc = job.model.hidden_size, job.train.gradient_checkpointing
    graph = encoder_graph(v, images, h, w, prec, trained, lora) if trained or adapted else 0
    # kept for the backward: the codes' embedding indices (embed_tokens trains), masked_scatter's mask (the embeddings
    # require grad: trained, or hooked under LoRA with checkpointing), the hooked image embeddings' leaf
    seq = micro_batch(job).tokens
    saved = (INDEX * tokens + seq if trained else 0) + \
        (seq + tokens * hidden * prec.weight if lora.enabled and gc else 0)
    # forward only: the graph, the image embeddings (pooler_output's split views) and their concatenation
    forward_only = graph + 2 * tokens * hidden * prec.weight
    quant = quantizer_peak(v, images, h, w, prec)
    before = nograd_peak(v, images, h, w, prec)
    # the instants before the language model runs (the quantizer's, the no-graph levels'), whose phase holds the
    # forward-only terms: the image embeddings do not exist yet
    embeds = 2 * tokens * hidden * prec.weight
    what = ("VQ-VAE loaded, no gradient through its argmin (full fine-tuning: its graph kept through the forward)"
            if trained else f"VQ-VAE frozen; LoRA on its {len(adapted)} attention Linear kinds, no gradient")
    return VisionTerms(weights=weights, gradients=states.grads, optimizer=states.opt,
                       pixels=images * v.in_channels * h * w * FP32, saved=saved, merger_saved=0, blocks_saved=(),
                       block_full=0, block_backward=0, block_grads=0, merger_grads=0, patches=images * g.patches,
                       image_tokens=tokens, trained=what, forward_only=forward_only,
                       connector_forward=max(quant - embeds, before - graph - embeds, 0),
                       reference_pass=max(quant, before) if job.train.trainer == "dpo" else 0,
                       # DPO's reference forward runs under no_grad (trl/trainer/dpo_trainer.py `_compute_loss`): the
                       # VQ-VAE records no graph there, so only the image embeddings stay alive through its decoder
                       reference_forward=embeds)

"""Chameleon's image path in a vision-language job (hpcmem.models.chameleon `ChameleonTowerSpec`): a VQ-VAE encoder
whose integer codes the decoder embeds with its own token embeddings; its terms as hpcmem.estimate.vision's
`VisionTerms`, which `with_vision` places in the learned chameleon_text part's phases (hpcmem.models.vlm_learned).

How the step runs (transformers 5.24 models/chameleon/modeling_chameleon.py): `ChameleonModel.forward` embeds the
tokens, then `get_image_features` runs `vqmodel.encode` on pixel_values [images, 3, 512, 512] (fp32 from the
processor): `ChameleonVQVAEEncoder.forward` (conv_in; per level its ResnetBlocks — GroupNorm, `h *= sigmoid(h)` in
place, conv1, GroupNorm, `h *= sigmoid(h)`, dropout, conv2, the residual — and a padded stride-2 downsample; mid's
two ResnetBlocks around an attention block; norm_out, x·sigmoid(x), conv_out), `quant_conv`, and
`ChameleonVQVAEVectorQuantizer.forward` (distances to the 8,192 codebook rows, `argmin`, the codebook rows, the
embedding loss, the straight-through sum); the codes map to token ids (`convert_img2bpe`, on the CPU) that
`embed_tokens` embeds (`pooler_output`), `masked_scatter` writes them into the `<image>` rows, and the decoder runs as
on text rows. The codes are integers: no gradient reaches the VQ-VAE from the loss, so it never runs a backward and
its parameters get no gradient and no AdamW state, whatever trains (it has no nn.Linear: peft's "all-linear" adapts
nothing in it).

What its forward leaves depends on whether autograd records it:
- full fine-tuning: the VQ-VAE's parameters require grad, so every op records its saved tensors (`graph_saved`). They
  hang from the encode outputs (`last_hidden_state`, `quantized_last_hidden_state`, `embedding_loss`) that
  `mm_encoder_outputs` (a local of `ChameleonModel.forward`) holds, and nothing the loss reaches does: forward only.
  Traced, they are still alive at TRL's fused LM head's forward (trl/trainer/utils.py `add_fused_lm_head`: the
  no-checkpointing peaks are there, at the loss, with them) and gone by the backward; the forward phase holds them,
  which under checkpointing a learned profile ends at its last layer, not at the head (not modelled there).
- LoRA: nothing in it requires grad (peft freezes it, pixel_values need none, `enable_input_require_grads` hooks the
  token embeddings only): no graph, nothing kept; its forward's own instant is the encoder's `hidden_states` list
  (every level's outputs, alive until `forward` returns) and one ResnetBlock's temporaries (`no_graph_instant`).
Under CUDA autocast (bf16) GroupNorm, softmax run in fp32 (their inputs cast to fp32 copies, their outputs fp32); the
sigmoid and the in-place product stay fp32; each Conv2d casts its fp32 input to a 16-bit copy.
"""

from __future__ import annotations

from hpcmem.estimate.lora import LoraLayout
from hpcmem.estimate.vision import FP32, VisionTerms, token_leaf, unused_tower
from hpcmem.job.image_rules import image_rows
from hpcmem.job.images import image_geometry
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import Precision, micro_batch
from hpcmem.models.chameleon import GROUPS, ChameleonTowerSpec

INDEX = 8       # int64 codes


def chameleon_terms(job: JobSpec, prec: Precision, lora: LoraLayout) -> VisionTerms:
    v: ChameleonTowerSpec = job.model.vision
    images, _ = image_rows(job)
    weights = v.num_params * prec.weight        # nothing trains or takes an adapter in it
    if images == 0:
        return unused_tower(weights)
    trained = not lora.enabled
    gc = job.train.gradient_checkpointing
    tokens = images * image_geometry(job.train, v).tokens
    width = job.model.hidden_size
    pixels = images * v.in_channels * v.crop ** 2 * FP32
    # masked_scatter keeps its boolean mask [rows, seq, 1] (its source's gradient is masked_select by it); under LoRA
    # with checkpointing `enable_input_require_grads` makes both embed_tokens outputs leaves that need a gradient:
    # the text rows' (hpcmem.estimate.vision `token_leaf`) and the image codes' [images · 1024, width], each held by
    # its AccumulateGrad node until the backward reaches it
    mask = micro_batch(job).tokens
    leaves = token_leaf(job, prec) + tokens * width * prec.act if lora.enabled and gc else 0
    saved = mask + leaves
    # `pooler_output`, the codes' embeddings [images, 1024, width], in mm_encoder_outputs until the backbone returns
    features = tokens * width * prec.act
    graph = images * graph_saved(v, prec) if trained else 0
    instant = images * no_graph_instant(v, prec)
    # full fine-tuning: the token embedding's backward runs once per call; the image codes' call makes a second dense
    # [vocab, width] gradient that AccumulateGrad adds into .grad (torch's embedding_dense_backward), beside every
    # other gradient at the backward's end
    embed_twice = job.model.vocab_size * width * prec.weight if trained else 0
    what = ("VQ-VAE loaded, no gradient (its codes are integers): full fine-tuning records its forward, freed with "
            "the backbone's outputs" if trained else "VQ-VAE frozen and not adapted (no nn.Linear in it): no graph")
    return VisionTerms(weights=weights, gradients=0, optimizer=0, pixels=pixels, saved=saved, merger_saved=0,
                       blocks_saved=(), block_full=0, block_backward=0, block_grads=0, merger_grads=0,
                       patches=images * v.image_patches, image_tokens=tokens, trained=what,
                       forward_only=graph + features,
                       # DPO's reference forward runs under no_grad (trl/trainer/dpo_trainer.py `_compute_loss`): no
                       # recorded forward there, the codes' embeddings alone through its decoder
                       reference_forward=features,
                       # full fine-tuning: its recorded forward, alive through the decoder's, bounds its own instant
                       connector_forward=0 if trained else instant,
                       reference_pass=instant + features if entry_has_reference(job) else 0,
                       embedding_backward=embed_twice)


def entry_has_reference(job: JobSpec) -> bool:
    """DPO's reference forward runs the VQ-VAE again, under no_grad, after the policy's (dpo_trainer.py
    `_compute_loss`)."""
    return job.train.trainer == "dpo"


def _norm(prec: Precision) -> int:
    """Bytes per element of a GroupNorm's input copy and output: fp32 under autocast, else the compute dtype."""
    return FP32 if prec.amp else prec.act


def _stats(groups: int = GROUPS) -> int:
    """A GroupNorm's fp32 mean and rstd, one per group (aten native_group_norm)."""
    return 2 * groups * FP32


def _resnet_saved(cin: int, cout: int, area: int, prec: Precision) -> int:
    """One ChameleonVQVAEEncoderResnetBlock's saved tensors under a recording forward: per GroupNorm its input (the
    fp32 cast under autocast) and statistics; per `h *= sigmoid(h)` sigmoid's output and the product's original
    left factor (an in-place mul whose other factor needs a gradient keeps a copy of it); per conv its input (the
    16-bit cast of the fp32 product under autocast); the 1 × 1 nin_shortcut its input where the widths differ.
    Dropout at p 0 returns its input (aten `dropout`): no mask."""
    n, a = _norm(prec), prec.act
    per = lambda c: area * c * (n + 2 * n + a) + _stats()       # noqa: E731 — norm, silu, conv input
    return per(cin) + per(cout) + (area * cin * a if cin != cout else 0)


def _attn_saved(c: int, area: int, prec: Precision) -> int:
    """ChameleonVQVAEEncoderAttnBlock's saved tensors: the GroupNorm's input and statistics; q, k, v each their
    16-bit cast of the fp32 norm output (one shared output without autocast); bmm(q, k) both factors; softmax its
    [area, area] output (fp32 under autocast); bmm(v, attn) v and the 16-bit cast of the weights; proj_out its input."""
    n, a = _norm(prec), prec.act
    casts = 3 if prec.amp else 1
    return (area * c * n + _stats() + casts * area * c * a + 2 * area * c * a + area * area * n
            + area * c * a + (area * area * a if prec.amp else 0) + area * c * a)


def graph_saved(v: ChameleonTowerSpec, prec: Precision) -> int:
    """What one image's recording VQ-VAE forward keeps (modeling_chameleon.py `ChameleonVQVAEEncoder.forward`,
    `ChameleonVQVAE.encode`, `ChameleonVQVAEVectorQuantizer.forward`): conv_in's 16-bit input cast; each level's
    ResnetBlocks and attention blocks, and the downsample conv's padded input [c, s + 1, s + 1]; mid's two
    ResnetBlocks and attention block; norm_out's input and its x·sigmoid(x), conv_out's input; quant_conv's input
    (conv_out's output, also last_hidden_state); the quantizer's contiguous [area, embed_dim] rows (kept by the
    squared norm and the distance einsum), the two loss terms' differences (kept by pow) and the
    quantized_last_hidden_state."""
    a, n = prec.act, _norm(prec)
    total = v.in_channels * v.crop ** 2 * a
    for lv in v.levels():
        area, c = lv.side ** 2, lv.cin
        for _ in range(v.num_res_blocks):
            total += _resnet_saved(c, lv.cout, area, prec) + (_attn_saved(lv.cout, area, prec) if lv.attention else 0)
            c = lv.cout
        total += c * (lv.side + 1) ** 2 * a if lv.downsample else 0
    c, area = v.mid_channels, v.latent_side ** 2
    total += 2 * _resnet_saved(c, c, area, prec) + (_attn_saved(c, area, prec) if v.mid_attention else 0)
    total += area * c * (3 * n + a) + _stats()
    latent = 2 * v.latent_channels if v.double_latent else v.latent_channels
    total += area * latent * a
    total += area * v.embed_dim * a * 4 + area * INDEX
    return total


def no_graph_instant(v: ChameleonTowerSpec, prec: Precision) -> int:
    """One image's no-grad VQ-VAE forward at its widest (`ChameleonVQVAEEncoder.forward` keeps every level's output in
    its `hidden_states` list until it returns): over the ResnetBlocks, the list so far (conv_in's output, the earlier
    blocks' and downsamples' outputs, the block's input among them) and the block's own widest moment — its second
    GroupNorm's, conv1's output beside the norm's input copy and output (fp32 under autocast), or its first
    GroupNorm's, the input copy and output — and conv_in's input cast beside nothing else."""
    a, n = prec.act, _norm(prec)
    listed = v.base_channels * v.crop ** 2 * a          # conv_in's output
    worst = 0
    for lv in v.levels():
        area, c = lv.side ** 2, lv.cin
        for _ in range(v.num_res_blocks):
            inside = max(area * c * 2 * n, area * lv.cout * (a + 2 * n))
            worst = max(worst, listed + inside)
            listed += area * lv.cout * a
            c = lv.cout
        listed += c * (lv.side // 2) ** 2 * a if lv.downsample else 0
    return worst

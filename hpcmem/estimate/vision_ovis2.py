"""Ovis2's tower, visual tokenizer and visual embedding table in a vision-language SFT job (hpcmem.models.ovis2): their
states, what their forward keeps for the backward, and the tower's backward, as hpcmem.estimate.vision's
`VisionTerms`, which `with_vision` places in the step's phases as it does for the other towers.

How the step runs (transformers 5.24 models/ovis2/modeling_ovis2.py): pixel_values [images, 3, side, side] fp32 →
`Ovis2VisionEmbeddings.forward` (cast to the weight dtype for the Conv2d, flatten, `rms_norm`, the position table
added) → `depth` `Ovis2VisionEncoderLayer`s over [images, patches, width] (RMSNorm → q/k/v/out_proj attention,
RMSNorm → gate/up/down_proj SwiGLU: a Qwen2 decoder layer's tensors without rotary) → the last RMSNorm →
`Ovis2VisionModel.forward`: the hidden_stride × hidden_stride blocks concatenated (pad, reshape, permute, reshape:
a [m, stride²·width] copy), `head_linear` → `head_norm` (LayerNorm over the visual vocabulary less the indicators) →
softmax → `Ovis2Model.get_image_features`: `torch.cat` with zero indicator columns, `Ovis2VisualEmbeddingTable`'s
matmul with the table → the image tokens' embeddings (`masked_scatter`), the indicator rows written over their
tokens' embeddings.

Trained or frozen is what TRL and peft do: full fine-tuning trains everything; LoRA "all-linear" adapts every
q/k/v/out_proj, gate/up/down_proj and head_linear (the table is an nn.Embedding, head_norm a LayerNorm: neither is
wrapped). Ovis2VisionModel names no input embeddings, so `enable_input_require_grads` hooks the token embeddings
alone: a LoRA job none of whose targets reaches the tower runs it without a graph, checkpointing or not.
"""

from __future__ import annotations

from dataclasses import replace

from hpcmem.estimate import activations as act
from hpcmem.estimate.lora import LoraLayout, backward_bytes_per_input
from hpcmem.estimate.states import optimizer_bytes_per_param
from hpcmem.estimate.vision import (FP32, VisionTerms, adapters_saved, block_saved, block_spec, graphless_tower,
                                    layer_norm_saved, token_leaf, tower_weights, trained_parts, unused_tower)
from hpcmem.job.image_rules import image_rows
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import MicroBatch, Precision
from hpcmem.models.ovis2 import Ovis2TowerSpec


def rms_norm_saved(h: int, prec: Precision, trained: bool) -> int:
    """Bytes per row an Ovis2RMSNorm keeps (modeling_ovis2.py Ovis2RMSNorm.forward, Qwen2RMSNorm's): the fp32 upcast
    for the variance and the product's backward, and, when its weight trains, the normalised tensor cast back for the
    weight's gradient and the cast's own input (as hpcmem.estimate.vision `outside_saved` counts a merger RMSNorm)."""
    return FP32 * h + ((prec.residual + prec.act) * h if trained else 0)


def head_saved(v: Ovis2TowerSpec, m: int, prec: Precision, trained: bool) -> int:
    """What the visual tokenizer and the table keep on the m image-token rows: head_linear's input (the concatenated
    [m, stride²·width] copy) when it trains; head_norm's input (cast to fp32 under autocast, where layer_norm is an
    fp32 op) and its fp32 mean and rstd (`layer_norm_saved`; its output feeds softmax, not a linear); softmax's output
    (its backward reads it; fp32 under autocast, where softmax is an fp32 op too); and, when the table trains, the
    matmul's input, the [m, vocab_size] concatenation with the zero indicator columns (autocast's compute-dtype copy
    of the fp32 concatenation)."""
    s2h = v.hidden_stride ** 2 * v.hidden_size
    probs = FP32 if prec.amp else prec.act
    return m * ((prec.act * s2h if trained else 0) + layer_norm_saved(v.head_width, prec, frozen=True)
                + probs * v.head_width + (prec.act * v.visual_vocab_size if trained else 0))


def reference_head(v: Ovis2TowerSpec, n: int, m: int, prec: Precision) -> int:
    """The visual tokenizer's worst instant in a no-grad pass (DPO's reference forward), in head_norm: the
    transformer's output (`outputs`, [n, width]), the concatenated [m, stride²·width] copy (`last_hidden_state`,
    returned in the output), head_linear's output and head_norm's output, [m, vocab_size − indicators] each, and
    under autocast head_norm's fp32 copy of its input, its output fp32 too. At softmax head_linear's output is gone
    (`logits` renamed to head_norm's output) and softmax's output (fp32 under autocast) takes its place: no more.
    Later, at the table's matmul in `get_image_features`, the transformer's output is gone and the probabilities,
    their [m, vocab_size] concatenation, its compute-dtype copy under autocast and the [m, text width] product are
    alive beside the copy."""
    s2h, vocab = v.hidden_stride ** 2 * v.hidden_size, v.head_width
    head = vocab * (prec.act + 2 * FP32 if prec.amp else 2 * prec.act)
    return prec.act * (v.hidden_size * n + s2h * m) + head * m


def ovis2_terms(job: JobSpec, prec: Precision, lora: LoraLayout) -> VisionTerms:
    v: Ovis2TowerSpec = job.model.vision
    images, n = image_rows(job)             # n: the tower's rows, images × patches
    adapted, _, weights = tower_weights(job, v, prec, lora)
    r, w, trained = job.train.lora_r, prec.weight, not lora.enabled
    if images == 0:
        return unused_tower(weights)
    h = v.hidden_size
    m = images * v.tokens_per_image
    pixels = n * v.patch_dim * FP32
    if lora.enabled and not adapted:
        # nothing in the tower requires grad and no hook reaches it: no graph, no backward; under checkpointing the
        # hooked token embeddings' output is a leaf
        return graphless_tower(weights=weights, pixels=pixels, patches=n, image_tokens=m,
                               saved=token_leaf(job, prec) if job.train.gradient_checkpointing else 0,
                               why="nothing hooks its patch embedding")
    gbytes = w if trained else lora.adapter_bytes
    tower_adapters = [x for x in adapted if x.part == "tower"]
    merger_adapters = [x for x in adapted if x.part == "merger"]
    per_block, merger = trained_parts(v, tower_adapters, merger_adapters, r, trained)
    outside = v.embed_params + h if trained else 0          # embeddings and the last RMSNorm
    trainable = outside + per_block * v.depth + merger
    grads = trainable * gbytes
    opt = int(trainable * optimizer_bytes_per_param(job.train.optim, gbytes))
    # Ovis2VisionAttention: three Linears, no attention mask (every image the same square: full attention per image)
    spec = replace(block_spec(v), fused_qkv=False)
    mb = MicroBatch(rows=1, seq=n, label_tokens=0, padding_free=False, source="", attn_implementation="sdpa")
    block = block_saved(job, v, spec, mb, prec, v.block_params, adapted, lora)
    if job.train.gradient_checkpointing:     # Ovis2VisionEncoderLayer is a GradientCheckpointingLayer: its input
        blocks = (prec.residual * h * n,) * v.depth
    elif trained:
        blocks = (block,) * v.depth
    else:
        # frozen: the first layer's input (the embeddings' output) needs no grad (nothing hooks the tower), so its
        # rms_norm1 keeps nothing; the later layers' inputs carry their adapters' grad and theirs keeps its fp32 upcast
        blocks = (block - rms_norm_saved(h, prec, False) * n,) + (block,) * (v.depth - 1)
    # before the layers, trained: the Conv2d's input (pixel_values in the weight dtype) and the embeddings' RMSNorm;
    # frozen, nothing there requires grad. Under checkpointing with PEFT the token embeddings' output is a leaf
    before = n * (v.patch_dim * w + rms_norm_saved(h, prec, True)) if trained else 0
    leaves = token_leaf(job, prec) if not trained and job.train.gradient_checkpointing else 0
    merger_saved = rms_norm_saved(h, prec, trained) * n + head_saved(v, m, prec, trained) + adapters_saved(
        merger_adapters, m, prec, lora)
    saved = sum(blocks) + before + leaves + merger_saved
    hidden_t, mlp_t, scores_t = act.backward_parts(spec, mb, prec, "sdpa")

    def adapter_t(mlp: bool) -> int:
        ins = [x.in_features for x in tower_adapters if x.name.startswith("ffn.") == mlp]
        return n * max(ins) * backward_bytes_per_input(lora) if ins else 0
    # without checkpointing the MLP's adapters run their backward and then the base path's, one after the other (as
    # hpcmem.estimate.vision's rule for SigLIP's MLP); a recomputed block makes the adapters' copies beside the base's
    gc = job.train.gradient_checkpointing
    mlp = mlp_t + adapter_t(True) if gc else max(mlp_t, adapter_t(True))
    what = ("tower, visual tokenizer and table trained (full fine-tuning)" if trained else
            f"frozen; LoRA on {len(adapted)} of its linear kinds")
    return VisionTerms(weights=weights, gradients=grads, optimizer=opt, pixels=pixels, saved=saved,
                       merger_saved=merger_saved, blocks_saved=blocks, block_full=block,
                       block_backward=hidden_t + max(mlp, scores_t + adapter_t(False)),
                       block_grads=per_block * gbytes, merger_grads=merger * gbytes, patches=n, image_tokens=m,
                       trained=what, reference_connector=reference_head(v, n, m, prec))

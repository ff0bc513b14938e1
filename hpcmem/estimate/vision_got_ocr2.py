"""PP-Chart2Table's GOT-OCR 2.0 tower and projector in a vision-language job (hpcmem.models.got_ocr2_tower), as
hpcmem.estimate.vision's `VisionTerms`, which `with_vision` places in the Qwen2 text part's phases.

How the step runs (transformers 5.24 models/got_ocr2/modeling_got_ocr2.py): `GotOcr2Model.forward` casts
pixel_values [images, 3, S, S] fp32 to the embeddings' dtype (`pixel_values.to(inputs_embeds.dtype)`: the patch
Conv2d's input, kept for its weight gradient when it trains) → `GotOcr2VisionEncoder.forward`: patch_embed (its output
a leaf under LoRA with checkpointing: `get_input_embeddings` names it, `enable_input_require_grads` hooks it) plus
pos_embed → `depth` `GotOcr2VisionLayer`s, each a GradientCheckpointingLayer (under checkpointing its input alone):
- layer_norm1 (autocast runs layer_norm in fp32: it keeps its fp32 input copy and mean/rstd; its fp32 output is
  zero-padded to whole windows and partitioned by `window_partition` on a windowed layer: Np ≥ N rows);
- `GotOcr2VisionAttention.forward` over Np rows (eager: the class supports neither SDPA nor flash): qkv's input (the
  16-bit autocast copy, kept when qkv trains), the contiguous copy `qkv.reshape(3, B·heads, T, d)` makes of the
  permuted output (query, key and value are its views: kept by the two matmuls and the einsums), `query * scale`
  (kept by the product with the keys), the two `torch.einsum` of `get_decomposed_rel_pos` (each permutes the query
  into its bmm's batch layout: one copy of the query each, kept), the fp32 softmax output (`softmax(dtype=float32)`
  keeps it) and its 16-bit copy (`.to(query.dtype)`, kept by the product with the values; dropout p 0 returns its
  input), [B·heads, T, T] each — T = window_size² on a windowed layer, the whole grid on a global one — and proj's
  input (the permuted output's copy, kept when proj trains);
- layer_norm2 (fp32 input and stats; its output cast for lin1, kept when lin1 trains), GELU's input (lin1's output),
  lin2's input (GELU's output) when lin2 trains; under LoRA the adapters' own.
→ `GotOcr2VisionNeck` (conv1 1 × 1 keeps its input when trained; channels-first LayerNorms keep their fp32 inputs and
stats; conv2 keeps the 16-bit autocast copy of the fp32 norm output when trained) → `last_hidden_state` (the fp32
output of the last LayerNorm) → `GotOcr2MultiModalProjector`: conv_upsampler1 (its 16-bit input copy when trained),
conv_upsampler2 (its input when trained), the flattened rows' copy multimodal_projector keeps when it trains →
`pooler_output` [images, tokens, text width], masked_scatter into the token embeddings. `last_hidden_state` and
`pooler_output` are held by the model's output (`GotOcr2ModelOutputWithPast.image_outputs`): forward-only locals here.

The widest instants are the global layer's attention. Its forward, at the softmax: `softmax(x, dtype=float32)`
converts the 16-bit sum to fp32 before it runs (aten SoftMax.cpp: only a Half input on CUDA has the half_to_float
kernel), so the fp32 input copy, the fp32 output, `decomposed_rel_pos` (a local alive until the attention returns) and
the sum are alive at once: 12 bytes a score, before the layer's later saved tensors exist. Its backward, at the
softmax's: the saved fp32 output and two fp32 gradients (the `.to` copy's and the softmax input's; hpcmem.estimate.
activations `backward_parts`, eager), the 16-bit probabilities and everything the layer kept after its attention
(layer_norm2's, the MLP's, proj's input and their adapters') already freed by their own backward. A DPO reference
pass (no grad) would hold the same 12 bytes a score (DPO itself is refused on this type: hpcmem.job.image_rules
`TRAINER_FAILS`).
"""

from __future__ import annotations

from hpcmem.estimate.lora import LoraLayout, backward_bytes_per_input
from hpcmem.estimate.states import optimizer_bytes_per_param
from hpcmem.estimate.vision import (FP32, LAYER_NORM_STATS, VisionTerms, adapters_saved, graphless_tower, token_leaf,
                                    tower_weights, unused_tower)
from hpcmem.job.image_rules import image_rows
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import Precision
from hpcmem.models.got_ocr2_tower import GotOcr2TowerSpec


def _scores(v: GotOcr2TowerSpec, images: int, global_attention: bool) -> int:
    """Elements of one layer's [B·heads, T, T] attention scores: one grid of N² per image, or Np / window² windows
    of window⁴."""
    if global_attention:
        return images * v.num_heads * v.patches ** 2
    return images * v.windows * v.num_heads * v.window_size ** 4


def got_ocr2_terms(job: JobSpec, prec: Precision, lora: LoraLayout) -> VisionTerms:
    v: GotOcr2TowerSpec = job.model.vision
    images, n = image_rows(job)
    adapted, _, weights = tower_weights(job, v, prec, lora)
    if images == 0:
        return unused_tower(weights)
    r, w, trained, gc = job.train.lora_r, prec.weight, not lora.enabled, job.train.gradient_checkpointing
    h, i, a, c, t = v.hidden_size, v.intermediate_size, prec.act, v.output_channels, v.out_hidden_size
    pixels = images * v.in_channels * v.image_size ** 2 * FP32
    tokens = images * v.tokens_per_image
    if lora.enabled and not adapted and not gc:
        return graphless_tower(weights=weights, pixels=pixels, patches=n, image_tokens=tokens)
    gbytes = w if trained else lora.adapter_bytes
    adapted = list(adapted)
    layer_adapters = [x for x in adapted if x.part == "tower"]

    def adapter_params(kinds: list) -> int:
        return sum(r * (x.in_features + x.out_features) * x.count for x in kinds)

    trainable = v.num_params if trained else adapter_params(adapted)
    grads = trainable * gbytes
    opt = int(trainable * optimizer_bytes_per_param(job.train.optim, gbytes))
    norm_in = FP32 * h + LAYER_NORM_STATS       # an autocast LayerNorm's fp32 input copy and mean/rstd, per row

    def post_attention(global_attention: bool) -> int:
        """What a layer keeps after its attention: proj's input when it trains, layer_norm2's fp32 input and stats and
        its output for lin1 when lin1 trains, GELU's input, lin2's input when it trains, their adapters'."""
        rows = n if global_attention else images * v.padded_grid ** 2
        return (norm_in * n + (a * h * (rows + n) if trained else 0) + a * i * n * (2 if trained else 1)
                + adapters_saved([x for x in layer_adapters if x.name == "attn.proj"], rows, prec, lora)
                + adapters_saved([x for x in layer_adapters if x.name.startswith("mlp.")], n, prec, lora))

    def layer_saved(global_attention: bool) -> int:
        rows = n if global_attention else images * v.padded_grid ** 2
        before_scores = norm_in * n + (a * h * rows if trained else 0)
        # the qkv copy (3 · width), query · scale, the two einsums' query copies (kept only for the gradients of the
        # trained rel_pos tables: a frozen table's einsum keeps the table alone)
        attention = a * h * rows * (3 + 1 + (2 if trained else 0)) + (FP32 + a) * _scores(v, images, global_attention)
        own = adapters_saved([x for x in layer_adapters if x.name == "attn.qkv"], rows, prec, lora)
        return before_scores + attention + own + post_attention(global_attention)

    full = {True: layer_saved(True), False: layer_saved(False)}
    kinds = tuple(k in v.global_attn_indexes for k in range(v.depth))
    blocks = (prec.residual * h * n,) * v.depth if gc else tuple(full[k] for k in kinds)
    # before the layers: the patch Conv2d's 16-bit input when it trains; the hooked patch embedding's output and the
    # token embeddings' output, leaves under LoRA with checkpointing
    conv_in = images * v.in_channels * v.image_size ** 2 * a if trained else 0
    leaves = n * h * w + token_leaf(job, prec) if (not trained and gc) else 0
    before = conv_in + leaves
    # the neck: conv1's input (trained), two LayerNorms' fp32 inputs and stats, conv2's 16-bit input (trained); the
    # projector: conv_upsampler1's 16-bit input copy and conv_upsampler2's input (trained), the Linear's input rows
    quarter = -(-v.grid // 2) ** 2 * images
    neck = 2 * (FP32 * c + LAYER_NORM_STATS) * n + ((a * h + a * c) * n if trained else 0)
    projector = ((a * c * n + a * 2 * c * quarter + a * t * tokens) if trained else 0) + \
        adapters_saved([x for x in adapted if x.part == "merger"], tokens, prec, lora)
    merger_saved = neck + projector
    saved = sum(blocks) + before + merger_saved
    global_scores = _scores(v, images, any(kinds))
    # one layer's backward: the residual gradients, then the MLP's or the eager attention's (the fp32 gradient of the
    # softmax output and the softmax input's, beyond the probabilities it frees), the adapters'
    hidden_t = 2 * prec.residual * h * n
    mlp_t = 2 * a * i * n
    # the attention's backward runs after the MLP's and layer_norm2's: their saved tensors and proj's are freed by
    # then (autograd drops each node's saved tensors once its backward has run)
    scores_t = max(0, (FP32 + a) * global_scores - post_attention(any(kinds)))
    adapter_t = n * max(x.in_features for x in layer_adapters) * backward_bytes_per_input(lora) \
        if layer_adapters else 0
    per_block = (v.block_params if trained else adapter_params(layer_adapters) // v.depth) * gbytes
    merger_grads = ((v.merger_params + v.neck_params if trained else
                     adapter_params([x for x in adapted if x.part == "merger"])) * gbytes)
    # the global layer's forward instant at its softmax: `softmax(x, dtype=torch.float32)` on a 16-bit x converts it
    # to fp32 first (aten/src/ATen/native/SoftMax.cpp `softmax`: only a Half input on CUDA takes the half_to_float
    # kernel; bf16 does not), so the fp32 input copy lives beside the fp32 output, with decomposed_rel_pos and the
    # scores' sum (16-bit): 12 bytes a score where 6 are kept, and the layer's later saved tensors (the 16-bit
    # probabilities, post_attention) not yet made; under checkpointing nothing is kept, so the whole 12, the qkv
    # output and query · scale, and layer_norm1's fp32 output
    block_forward = (max(0, (2 * a + 2 * FP32) * global_scores - (FP32 + a) * global_scores
                         - post_attention(any(kinds))) if not gc else
                     (2 * a + 2 * FP32) * global_scores + 4 * a * h * n + FP32 * h * n)
    # DPO's reference pass (no grad): the widest layer's scores sum, decomposed_rel_pos, the softmax's fp32 input copy
    # and output, and the qkv copy with query · scale
    reference = (2 * a + 2 * FP32) * global_scores + 4 * a * h * n
    what = ("tower and projector trained (full fine-tuning)" if trained else
            f"frozen; LoRA on {len(adapted)} of its linear kinds")
    return VisionTerms(weights=weights, gradients=grads, optimizer=opt, pixels=pixels, saved=saved,
                       merger_saved=merger_saved, blocks_saved=blocks, block_full=max(full.values()),
                       block_backward=hidden_t + max(mlp_t + adapter_t if gc else max(mlp_t, adapter_t), scores_t),
                       block_grads=per_block, merger_grads=merger_grads, patches=n, image_tokens=tokens,
                       trained=what, forward_only=FP32 * c * n + a * t * tokens,
                       block_forward=block_forward, reference_pass=reference)

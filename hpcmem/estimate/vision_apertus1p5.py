"""Apertus 1.5's image path in a vision-language job (hpcmem.models.apertus1p5 `Apertus1p5TowerSpec`): a VQ vision
tokenizer whose codes the text embedding embeds, as hpcmem.estimate.vision's `VisionTerms`, which `with_vision` places
in the learned apertus1p5_text part's phases (hpcmem.models.vlm_learned).

How the step runs (transformers 5.24 models/apertus1p5/modeling_apertus1p5.py): `Apertus1p5Model.forward` embeds the
text, then `get_image_features` → `get_image_tokens` runs the vision tokenizer on each image alone, cropped to its
size (`Apertus1p5VisionTokenizerModel.encode`: the fp32 encoder, quant_conv, the quantizer's Linear to codebook_size
logits and their argmax), adds image_token_offset, and embeds each image's codes with the text embedding; the codes'
embeddings go into the image tokens' rows (`masked_scatter`). The argmax's output needs no gradient: the tokenizer's
graph, whatever it holds, is freed when `encode` returns, and no gradient ever reaches its parameters — under full
fine-tuning they train in name only (no gradient, so no optimizer state: torch/optim/adamw.py `_init_group` skips a
parameter whose grad is None), under LoRA the adapter peft puts on `quantize.embedding` (its one nn.Linear) likewise.
The tokenizer (and the idle WavTokenizer audio encoder) stay fp32 whatever the load dtype
(`_keep_in_fp32_modules_strict`).

So the tokenizer is a forward instant before the language model (`connector_forward`; DPO's reference pass,
`reference_connector`): under full fine-tuning its parameters require grad, so every op keeps its saved tensors until
the argmax (`graph_instant`), and under autocast each weight's 16-bit copy stays in autocast's cache for the rest of the
forward (`forward_only`); under LoRA nothing but the quantizer's adapter builds a graph, and its worst instant is a
ResNet block's at the first stage or the quantizer's logits (`graphless_instant`). What the image path keeps for the
backward: masked_scatter's mask and, under full fine-tuning, the embedding's code indices (and its second dense
gradient at the step's last backward, `embedding_backward`); under LoRA with
checkpointing `enable_input_require_grads` hooks the token embeddings, whose outputs (the text's and each image's)
stay leaves of the graph (hpcmem.estimate.vision `token_leaf`).
"""

from __future__ import annotations

from hpcmem.estimate.lora import LORA_DROPOUT_MASK_BYTES, LoraLayout
from hpcmem.estimate.vision import FP32, VisionTerms, token_leaf, tower_weights, unused_tower
from hpcmem.job.image_rules import image_rows
from hpcmem.job.images import image_geometry
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import Precision, micro_batch
from hpcmem.models.apertus1p5 import Apertus1p5TowerSpec

INDEX = 8          # int64 code ids


def apertus1p5_terms(job: JobSpec, prec: Precision, lora: LoraLayout) -> VisionTerms:
    v: Apertus1p5TowerSpec = job.model.vision
    images, _ = image_rows(job)
    adapted, _, weights = tower_weights(job, v, prec, lora)
    # the tokenizers' parameters are fp32 (`_keep_in_fp32_modules_strict`), not the load dtype
    weights += v.num_params * (FP32 - prec.weight) + v.audio_params * FP32
    if images == 0:
        return unused_tower(weights)
    g = image_geometry(job.train, v)
    h, w = g.resized
    codes, width, a = g.tokens, job.model.hidden_size, act_bytes(prec)
    tokens = images * codes
    pixels = images * v.in_channels * h * w * FP32
    gc, trained = job.train.gradient_checkpointing, not lora.enabled
    if trained:
        instant = graph_instant(v, h, w, a) + codes * v.codebook_size * a
        cache = v.num_params * a if prec.amp else 0
    else:
        instant = graphless_instant(v, h, w, a, lora, bool(adapted))
        cache = 0
    # masked_scatter keeps its [rows, seq, 1] mask when its output needs a gradient; full fine-tuning's embedding
    # keeps the code indices; LoRA with checkpointing: the hooked embeddings' outputs stay leaves
    mask = micro_batch(job).tokens
    if trained:
        saved = mask + tokens * INDEX
    elif gc:
        saved = mask + token_leaf(job, prec) + tokens * width * prec.weight
    else:
        saved = 0
    # alive through the forward: the image features torch.cat makes in Apertus1p5Model.forward and, besides the
    # hooked leaves, the per-image embeddings `pooler_output` holds in the outputs; autocast's weight copies
    features = tokens * width * prec.weight * (1 if (not trained and gc) else 2)
    what = ("the vision tokenizer trains in name only (its codes' argmax passes no gradient)" if trained else
            "frozen" + (f"; LoRA on {len(adapted)} of its linear kinds, reached by no gradient" if adapted else ""))
    reference = graphless_instant(v, h, w, a, lora, False)     # the reference: adapters disabled, or none
    return VisionTerms(weights=weights, gradients=0, optimizer=0, pixels=pixels, saved=saved, merger_saved=saved,
                       blocks_saved=(), block_full=0, block_backward=0, block_grads=0, merger_grads=0,
                       patches=tokens, image_tokens=tokens, trained=what + "; the audio tokenizer loaded and idle",
                       # the instant's phase keeps the forward's `forward_only` (the weight copies already
                       # cached; the features, made after the tokenizer, not yet: taken off)
                       forward_only=features + cache, connector_forward=instant - features,
                       reference_connector=reference, embedding_backward=embedding_backward(job, prec, trained))


def embedding_backward(job: JobSpec, prec: Precision, trained: bool) -> int:
    """Under full fine-tuning the token embedding is called twice (the text's ids in Apertus1p5Model.forward, each
    image's codes in `get_image_features`): each call's backward (aten embedding_dense_backward) makes a dense
    [vocab, width] gradient in the weights' dtype, and the autograd engine holds the first until the second arrives
    to sum them into the table's one gradient, every other gradient already made. Frozen under LoRA: none."""
    return job.model.vocab_size * job.model.hidden_size * prec.weight if trained else 0


def act_bytes(prec: Precision) -> int:
    """The convolutions' and the quantizer's output bytes: autocast's dtype, else fp32 (the tokenizer's own)."""
    return prec.act if prec.amp else FP32


def _areas(v: Apertus1p5TowerSpec, h: int, w: int) -> list[int]:
    """Each stage's cells: the image halved per stage by the stride-2 downsample (ChameleonVQVAEEncoderConvDownsample:
    pad (0, 1, 0, 1), 3 × 3 at stride 2: (side − 2) // 2 + 1)."""
    out = []
    for _ in range(v.stages):
        out.append(h * w)
        h, w = (h - 2) // 2 + 1, (w - 2) // 2 + 1
    return out


def resnet_saved(cin: int, cout: int, area: int, a: int) -> int:
    """ChameleonVQVAEEncoderResnetBlock.forward with its weights requiring grad: each GroupNorm keeps its input as fp32
    (autocast's fp32 op casts it; fp32 already without), `hidden_states *= torch.sigmoid(hidden_states)` keeps the
    sigmoid's fp32 output and a copy of its input (an in-place multiply saves `self.clone()`), each 3 × 3 convolution
    its input in the compute dtype; a 1 × 1 nin_shortcut (width change) the block's input."""
    short = a * cin * area if cin != cout else 0
    return (3 * FP32 + a) * cin * area + (3 * FP32 + a) * cout * area + short


def attn_saved(c: int, area: int, a: int) -> int:
    """ChameleonVQVAEEncoderAttnBlock.forward with grad: the GroupNorm's fp32 input; q/k/v each its own cast input and
    output (q and k for the first bmm, v for the second); the [L, L] softmax's fp32 output and its cast for the
    second bmm; proj_out's input."""
    return (FP32 + 7 * a) * c * area + (FP32 + a) * area * area


def graph_instant(v: Apertus1p5TowerSpec, h: int, w: int, a: int) -> int:
    """Every saved tensor of `encode` with grad, alive at the quantizer's logits (the logits themselves added by the
    caller): conv_in's cast input, the stages' blocks and attention blocks, each downsample's padded input, the middle,
    norm_out's fp32 input with its x·sigmoid(x) factors (out of place: both kept), conv_out's cast input, quant_conv's
    and the quantizer's inputs."""
    areas = _areas(v, h, w)
    total, cin = a * v.in_channels * h * w, v.hidden_size
    for stage, (cout, area) in enumerate(zip(v.widths, areas)):
        for _ in range(v.num_res_blocks):
            total += resnet_saved(cin, cout, area, a) + (attn_saved(cout, area, a) if stage in v.attn_stages else 0)
            cin = cout
        if stage < v.stages - 1:
            side_h, side_w = _side(h, stage), _side(w, stage)
            total += a * cout * (side_h + 1) * (side_w + 1)
    top, last = v.widths[-1], areas[-1]
    total += 2 * resnet_saved(top, top, last, a) + attn_saved(top, last, a)
    total += 3 * FP32 * top * last + a * top * last
    return total + a * v.latent_channels * last + a * v.embed_dim * last


def _side(side: int, stage: int) -> int:
    for _ in range(stage):
        side = (side - 2) // 2 + 1
    return side


def graphless_instant(v: Apertus1p5TowerSpec, h: int, w: int, a: int, lora: LoraLayout, adapted: bool) -> int:
    """The tokenizer's widest instant without a graph: a first-stage ResNet block at its second GroupNorm (the block
    input kept as the residual, conv1's output, the norm's fp32 cast and output) — from the stage's second block on,
    the stage's input besides, which `Apertus1p5VisionTokenizerEncoder.forward` holds in its `hidden_states` until the
    stage returns (conv_in's output at the first stage) — or the quantizer: its input and
    logits, and with an adapter on `quantize.embedding` (peft lora.Linear.forward: `result + lora_B(lora_A(
    dropout(x))) * scaling`) the scaled adapter output and the sum beside them, plus the adapter's dropout output and
    mask."""
    c, area = v.hidden_size, h * w
    block = ((3 if v.num_res_blocks > 1 else 2) * a + 2 * FP32) * c * area
    codes = area // v.patch_size ** 2
    logits = codes * v.codebook_size * a
    quant = a * v.embed_dim * codes + (3 * logits if adapted else logits)
    if adapted:
        quant += codes * v.embed_dim * (a + (LORA_DROPOUT_MASK_BYTES if lora.dropout else 0))
    return max(block, quant)

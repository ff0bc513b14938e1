"""DeepSeek-OCR 2's vision part in a vision-language job (hpcmem.models.deepseek_ocr2), as hpcmem.estimate.vision's
`VisionTerms`, which `with_vision` places in the learned text part's phases.

How the step runs (transformers 5.24 models/deepseek_ocr2/modular_deepseek_ocr2.py `DeepseekOcr2Model.
get_image_features`): the vision model runs twice — first on the batch's global views (pixel_values [images, 3, 1024,
1024] fp32), then on all their tiles at once (pixel_values_local [tiles, 3, 768, 768] fp32, when any image has tiles)
— and each run is `DeepseekOcr2VisionModel.forward`:
- `DeepseekOcr2SamVisionEncoder.forward`: the patch Conv2d (its 16-bit input copy kept when it trains), the position
  table (bicubically interpolated to 48 × 48 for a tile), the SAM layers — SamVisionLayer with the SDPA attention and
  decomposed relative positions, what hpcmem.estimate.vision_deepseek_vl_hybrid's SAM layer (`_layer`) keeps, at the
  run's grid and batch — then the neck (conv1 1 × 1, a channels-first LayerNorm, conv2 3 × 3, a LayerNorm) and
  `DeepseekOcr2SamVisionProj` (conv1 and conv2, 3 × 3 stride 2): each convolution keeps its (16-bit) input whenever
  any of its inputs requires grad (ConvolutionBackward0), the LayerNorms their fp32 inputs and statistics;
- the features flattened and `torch.cat` with the query table's rows (144 for a tile, 256 for a global view): L = 2F
  rows per view, through `DeepseekOcr2VisionEncoder` (Qwen2's decoder layers: RMSNorms, q/k/v with biases, o_proj,
  the gated SiLU MLP; SDPA under a 4-D mask, bidirectional over the features and causal over the queries, so
  `repeat_kv` materialises k and v at every head) — hpcmem.estimate.activations' decoder layer at that shape, masked —
  and its final RMSNorm;
- the queries' rows (a view of the norm's output) through `multi_modal_projector` (which keeps that whole output when
  it trains), then per image `torch.cat([local, global, view_separator])` (`pooler_output`, held by the model's
  output) and `torch.cat` of those cast for masked_scatter (a local of `DeepseekOcr2Model.forward` while the language
  model runs): two 16-bit copies of the image tokens' rows in the forward only.
The local run is the later one, so its backward runs first; both runs share the weights, whose gradients the local
run's backward allocates and the global run's accumulates into. The blocks are listed in the forward's order — the
global run's SAM and encoder layers, then the local run's — and the SAM necks, convolutions and projector go with the
merger (their saved tensors beside the blocks').

Trained or frozen is what TRL and peft do: full fine-tuning trains all of it (a query table no view reads gets no
gradient, so no optimizer state: torch/optim/adamw.py `_init_group` skips it); LoRA all-linear adapts SAM's, the
encoder's and the projector's linears, the convolutions, norms, tables and view separator frozen.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcmem.estimate import activations as act
from hpcmem.estimate.lora import LoraLayout, backward_bytes_per_input
from hpcmem.estimate.states import optimizer_bytes_per_param
from hpcmem.estimate.vision import (FP32, VisionTerms, adapters_saved, layer_norm_saved, tower_weights,
                                    unused_tower)
from hpcmem.estimate.vision_deepseek_vl_hybrid import sam_layer
from hpcmem.job.image_rules import image_rows
from hpcmem.job.images import image_geometry
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import MicroBatch, Precision
from hpcmem.models.deepseek_ocr2 import GLOBAL_SIZE, QUERIES_768, TILE_SIZE, DeepseekOcr2TowerSpec, down
from hpcmem.models.spec import ModelSpec


@dataclass(frozen=True)
class Run:
    """One pass of the vision model: its blocks' saved bytes (checkpoint inputs under checkpointing), recomputes,
    backward temporaries, the merger-side saved bytes (SAM's head, the final norm, the projector), the SAM patch
    embedding's input, the forward's widest instant and the no-grad pass's."""

    blocks: tuple[int, ...]
    full: tuple[int, ...]
    backward: tuple[int, ...]
    head: int
    embed: int
    forward: int
    no_grad: int


def encoder_spec(v: DeepseekOcr2TowerSpec) -> ModelSpec:
    """An encoder layer as the decoder layer hpcmem.estimate.activations sizes (Qwen2DecoderLayer: q/k/v biases, no
    o_proj or MLP bias, grouped key/value heads)."""
    return ModelSpec(name="deepseek_ocr2 encoder", model_type="deepseek_ocr2_encoder", vocab_size=1,
                     hidden_size=v.hidden_size, intermediate_size=v.intermediate_size, num_hidden_layers=v.depth,
                     num_attention_heads=v.num_heads, num_key_value_heads=v.encoder_kv_heads, head_dim=v.head_dim,
                     tie_word_embeddings=False, hidden_act="silu", qkv_bias=True)


@dataclass(frozen=True)
class Sam:
    """SAM's part of a run: its layers' terms (hpcmem.estimate.vision_deepseek_vl_hybrid `SamLayer`), what each layer
    keeps (its checkpoint input under checkpointing), the neck's and convolutions' saved bytes, the patch
    embedding's input."""

    layers: tuple
    blocks: tuple[int, ...]
    head: int
    embed: int


def sam_run(job: JobSpec, v: DeepseekOcr2TowerSpec, views: int, size: int, prec: Precision, lora: LoraLayout,
            adapted: list) -> Sam:
    """SAM, its neck and its two convolutions over `views` squares of `size` px."""
    trained, gc = not lora.enabled, job.train.gradient_checkpointing
    a, c, (c1, _) = prec.act, v.sam_channels, v.downsample_channels
    view = v.view(size)
    g = view.sam_grid
    n = views * g * g
    layers = tuple(sam_layer(view, i, views, prec, trained, adapted, lora) for i in range(v.sam_depth))
    blocks = tuple(prec.residual * v.sam_hidden * n for _ in layers) if gc else tuple(x.full for x in layers)
    # the neck: conv1's input (the last layer's output), two channels-first LayerNorms, conv2's 16-bit input; the
    # projection: conv1's 16-bit input copy of the fp32 norm output, conv2's input at half the grid
    half = views * down(g) ** 2
    head = 2 * layer_norm_saved(c, prec, frozen=True) * n + a * v.sam_hidden * n + 2 * a * c * n + a * c1 * half
    embed = views * v.in_channels * size * size * a if trained else 0
    return Sam(layers=layers, blocks=blocks, head=head, embed=embed)


def with_encoder(sam: Sam, enc_full: int, enc_checkpoint: int, enc_backward: int, depth: int, gc: bool,
                 head: int) -> Run:
    """A run: SAM's layers, then `depth` encoder layers alike, SAM's head and the encoder's own (`head`) with the
    merger."""
    enc_blocks = (enc_checkpoint if gc else enc_full,) * depth
    forward = max(sum(sam.blocks[:k]) + sam.layers[k].forward for k in range(len(sam.layers)))
    return Run(blocks=sam.blocks + enc_blocks, full=tuple(x.full for x in sam.layers) + (enc_full,) * depth,
               backward=tuple(x.backward for x in sam.layers) + (enc_backward,) * depth,
               head=sam.head + head, embed=sam.embed, forward=forward - sum(sam.blocks),
               no_grad=max(x.no_grad for x in sam.layers))


def _run(job: JobSpec, v: DeepseekOcr2TowerSpec, views: int, size: int, prec: Precision, lora: LoraLayout,
         adapted: list) -> Run:
    """The vision model over `views` squares of `size` px: SAM, then the Qwen2 encoder over L = 2F rows a view."""
    trained, gc = not lora.enabled, job.train.gradient_checkpointing
    a, h = prec.act, v.hidden_size
    sam = sam_run(job, v, views, size, prec, lora, adapted)
    f = v.features(size)
    rows = 2 * f
    spec = encoder_spec(v)
    mb = MicroBatch(rows=views, seq=rows, label_tokens=0, padding_free=False, source="", image_mask=True)
    terms = act.layer_saved(spec, mb, prec, attn="sdpa", layer=0, layer_params=v.block_params,
                            lora=LoraLayout(enabled=False) if trained else LoraLayout(enabled=True, r=lora.r))
    terms = {**terms, "autocast_weights": 0}
    own = [x for x in adapted if x.part == "encoder"]
    enc_full = sum(terms.values()) + adapters_saved(own, views * rows, prec, lora)
    hidden_t, mlp_t, scores_t = act.backward_parts(spec, mb, prec, "sdpa")
    ins = [x.in_features for x in own]
    adapter_t = views * rows * max(ins) * backward_bytes_per_input(lora) if ins else 0
    # the final RMSNorm (its fp32 input, and its output for the projector when that trains: the queries' rows are a
    # view of it) and the projector's adapter
    norm = (FP32 * h + (prec.residual * h if trained else 0)) * views * rows
    projector = (a * h * views * rows if trained else 0) + \
        adapters_saved([x for x in adapted if x.part == "merger"], views * f, prec, lora)
    return with_encoder(sam, enc_full, prec.residual * h * views * rows, hidden_t + max(mlp_t, scores_t) + adapter_t,
                        v.depth, gc, norm + projector)


def runs_terms(job: JobSpec, v: DeepseekOcr2TowerSpec, prec: Precision, lora: LoraLayout, adapted: list,
               weights: int, runs: list[Run], enc_block: int, unused: int, pixels: int, n: int,
               tokens: int, forward_only: int) -> VisionTerms:
    """VisionTerms of the runs in the forward's order (the last run's backward first: it allocates the gradients);
    `enc_block` an encoder layer's parameters, `unused` those no view reads (no gradient, no optimizer state)."""
    trained, r = not lora.enabled, job.train.lora_r
    gbytes = prec.weight if trained else lora.adapter_bytes
    trainable = (v.num_params - unused) if trained else sum(r * (x.in_features + x.out_features) * x.count
                                                            for x in adapted)
    grads = trainable * gbytes
    opt = int(trainable * optimizer_bytes_per_param(job.train.optim, gbytes))
    sam_grads = [v.sam_layer_params(k) if trained else sum(r * (x.in_features + x.out_features)
                                                            for x in adapted if x.part == "sam")
                 for k in range(v.sam_depth)]
    enc_grads = [enc_block if trained else sum(r * (x.in_features + x.out_features)
                                               for x in adapted if x.part == "encoder")] * v.depth
    per_run = tuple(x * gbytes for x in sam_grads + enc_grads)
    blocks_grads = tuple(x for i, _ in enumerate(runs)
                         for x in (per_run if i == len(runs) - 1 else (0,) * len(per_run)))
    blocks = tuple(x for run in runs for x in run.blocks)
    head = sum(run.head for run in runs)
    saved = sum(blocks) + head + sum(run.embed for run in runs)
    # the forward's widest instant, beyond every block's saved tensors (hpcmem.estimate.vision `_forward_instant`
    # adds them and the tensors outside blocks and merger): in run i, the earlier runs' blocks and heads beside
    # run i's own instant
    forward, before = 0, 0
    for run in runs:
        forward = max(forward, before + sum(run.blocks) + run.forward)
        before += sum(run.blocks) + run.head
    what = ("SAM, the encoder and the projector trained (full fine-tuning)" if trained else
            f"frozen; LoRA on {len(adapted)} of its linear kinds")
    return VisionTerms(weights=weights, gradients=grads, optimizer=opt, pixels=pixels, saved=saved,
                       merger_saved=head, blocks_saved=blocks, block_full=max(x for run in runs for x in run.full),
                       block_backward=max(x for run in runs for x in run.backward), block_grads=max(per_run),
                       merger_grads=grads - sum(blocks_grads), patches=n, image_tokens=tokens, trained=what,
                       forward_only=forward_only, block_forward=max(0, forward - sum(blocks)),
                       reference_pass=max(run.no_grad for run in runs),
                       blocks_full=tuple(x for run in runs for x in run.full),
                       blocks_backward=tuple(x for run in runs for x in run.backward),
                       blocks_grads=blocks_grads)


def deepseek_ocr2_terms(job: JobSpec, prec: Precision, lora: LoraLayout) -> VisionTerms:
    v: DeepseekOcr2TowerSpec = job.model.vision
    images, n = image_rows(job)
    adapted, _, weights = tower_weights(job, v, prec, lora)
    if images == 0:
        return unused_tower(weights)
    adapted = list(adapted)
    t = job.train
    tiles = images * v.tiles(t.image_height, t.image_width)
    tokens = images * image_geometry(t, v).tokens
    pixels = FP32 * v.in_channels * (images * GLOBAL_SIZE ** 2 + tiles * TILE_SIZE ** 2)
    runs = [_run(job, v, images, GLOBAL_SIZE, prec, lora, adapted)]
    if tiles:
        runs.append(_run(job, v, tiles, TILE_SIZE, prec, lora, adapted))
    unused = 0 if tiles else QUERIES_768 * v.hidden_size    # query_768_resolution: read by tiles only
    return runs_terms(job, v, prec, lora, adapted, weights, runs, v.block_params, unused, pixels, n, tokens,
                      2 * prec.act * v.out_hidden_size * tokens)

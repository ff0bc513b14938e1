"""Reserved − allocated at the peak: the caching allocator's slack, from its mechanics (stdlib; no torch).

PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp; modelled in hpcmem/trace/allocator.py) never
returns memory during training: the reserved peak is every segment ever created. Segments are created when no cached
free block fits a request, so reserved exceeds the allocated peak by (a) what segment sizes waste on long-lived
tensors and (b) free blocks stranded at the peak instant — blocks an earlier phase freed that the peak's requests
cannot use. The terms (bytes, `slack_terms`):

- `packing`: (a) — the job's persistent tensors one by one (weights, adapters, AdamW states;
  hpcmem.estimate.tensors) through the allocator's rules (1–10 MiB tensors share 20 MiB segments, larger ones get
  their size rounded up to 2 MiB; expandable segments: 20 MiB pages), exact for them; its default-mode coefficient
  (≈ 1.9) also carries the gradients, which have the same sizes and are carved out during backward (under expandable
  segments the waste is at most a page per pool, 2 + 20 MiB, so the term stays small whatever its coefficient);
- `second_step`: the blocks the second step has to map afresh. torch's AdamW creates its states at the first
  `optimizer.step()` (torch/optim/adamw.py `_init_group`), after the first backward has freed its transients, and
  the allocator hands the states the cached blocks first (best fit): the first step ends with about
  max(first-step peak without the states, weights + gradients + states) reserved, and the big blocks the states took
  over — the fused LM head's fp32 [V, H] gradient accumulator and the [V, H] gradient (trl/kernels/chunked_logprob.py
  backward); Reward's embedding gradient (and its copy when tied) — get new segments in the second step. The term is
  that end of step one + those blocks − the peak, when positive (from the estimate's own phases). Default segments
  only: when the largest trainable layer weight is larger than the layer's largest block, its gradient (and states
  of its size) cannot be carved from the blocks the activations free, so the first step reserves weights + activations + gradients, and the states
  take only the freed head blocks (seen in the allocator model for Qwen2.5-7B and Phi-3 without checkpointing: the
  first step's gradient segments sit free at the second step's peak). Under expandable segments freed blocks merge
  in one address range and are reused;
- `head_tile`: the fused head's [4096, 32768] logits tile and fp32 [N, H] input gradient, freed before the layers'
  backward, which split it (the tile left out where the recompute takes its pages whole: `head_tile_kept`);
- `layer_blocks`: the largest block of a decoder layer (the MLP's [T, I] in the compute dtype, an fp32 [T, H]
  norm upcast, eager attention's fp32 [rows, heads, S, S] scores), a size that recurs layer after layer while
  gradients and saved tensors interleave with it;
- `allocated`: a small share of the peak for everything else (rounding of requests, short-lived blocks).

(b) is not replayed tensor by tensor: each term's coefficient — how much of such a block ends up stranded — is fitted
per allocator mode to the allocator model replaying the trace matrix (`python -m hpcmem.bench.reserved_fit`,
estimator/reserved-fit.json; held-out errors in estimator/LOG.md). Jobs the trace does not run (ZeRO, FSDP: flat
partitions, so no per-tensor `packing`; QLoRA) get the same terms with their own sizes, not held to the allocator
model.
"""

from __future__ import annotations

import bisect
import functools

from hpcmem.estimate.activations import effective_attention
from hpcmem.estimate.breakdown import Phase
from hpcmem.estimate.lora import LoraLayout
from hpcmem.estimate.loss import TOKEN_CHUNK_SIZE, VOCAB_CHUNK_SIZE
from hpcmem.estimate.shape import MicroBatch, Precision
from hpcmem.estimate.step import BACKWARD, FORWARD, GRADIENTS, OPTIMIZER_STATES, OPTIMIZER_STEP
from hpcmem.estimate.tensors import adapter_sizes, optimizer_state_sizes, parameter_sizes
from hpcmem.spec import JobSpec, ModelSpec
from hpcmem.trainers import entry
from hpcmem.trace.allocator import (
    K_LARGE_BUFFER,
    K_SMALL_BUFFER,
    K_SMALL_SIZE,
    allocation_size,
    round_size,
    should_split,
)

FP32 = 4
TERMS = ("packing", "second_step", "head_tile", "layer_blocks", "allocated")
# Fitted coefficients per allocator mode: least absolute deviations on the training split (python -m
# hpcmem.bench.reserved_fit; estimator/reserved-fit.json).
COEFFICIENTS: dict[str, dict[str, float]] = {
    "default": {"packing": 1.8674, "second_step": 0.3845, "head_tile": 0.1689, "layer_blocks": 1.1951,
                "allocated": 0.006},
    "expandable": {"packing": 2.7851, "second_step": 0.4399, "head_tile": 0.1443, "layer_blocks": 1.0338,
                   "allocated": 0.0018},
}


def packing_waste(sizes: tuple[int, ...], expandable: bool) -> int:
    """Reserved − the rounded requests after allocating `sizes` in order with nothing freed: the allocator model's
    rules (hpcmem.trace.allocator: 512 B rounding, best fit, split rules, segment sizes) specialised to allocations
    that live forever — each pool is then just the sorted remainders of its segments. Expandable segments map pages
    as the one region grows: only the last page of each pool is partly empty."""
    large: list[int] = []
    small: list[int] = []
    reserved = requested = small_total = large_total = 0
    for n in sizes:
        size = round_size(n)
        requested += size
        is_small = size <= K_SMALL_SIZE
        if expandable:
            small_total += size if is_small else 0
            large_total += 0 if is_small else size
            continue
        pool = small if is_small else large
        i = bisect.bisect_left(pool, size)
        if i < len(pool):
            block = pool.pop(i)
        else:
            block = allocation_size(size)
            reserved += block
        if should_split(block, size, is_small, False):
            bisect.insort(pool, block - size)
    if expandable:
        reserved = _pages(small_total, K_SMALL_BUFFER) + _pages(large_total, K_LARGE_BUFFER)
    return reserved - requested


def _pages(nbytes: int, page: int) -> int:
    return -(-nbytes // page) * page


@functools.lru_cache(maxsize=512)
def persistent_waste(m: ModelSpec, trainer: str, optim: str, weight_bytes: int, lora: LoraLayout,
                     expandable: bool) -> int:
    """`packing_waste` of a single-GPU job's weights, adapters and AdamW states, in allocation order (cached: the
    planner asks for the same model many times)."""
    base = parameter_sizes(m, trainer, weight_bytes)
    adapters = adapter_sizes(lora)
    trainable = adapters if lora.enabled else base
    return packing_waste(tuple(base + adapters + optimizer_state_sizes(optim, trainable)), expandable)


def slack_terms(job: JobSpec, mb: MicroBatch, prec: Precision, lora: LoraLayout, phases: list[Phase],
                expandable: bool | None = None) -> dict[str, int]:
    """The terms for the job's allocator mode (or the one named by `expandable`); `phases`: the estimate's (hpcmem.
    estimate.step), the peak allocated being the largest."""
    m, par = job.model, job.parallel
    expandable = job.expandable_segments if expandable is None else expandable
    sharded = par.fsdp or (par.deepspeed and par.zero_stage >= 1)
    lm_head = entry(job.train.trainer).head == "lm"
    n = mb.label_tokens
    block = largest_layer_block(job, mb, prec)
    return {
        # ZeRO / FSDP keep flat partitions, not one tensor per parameter: no per-tensor packing
        "packing": 0 if sharded else persistent_waste(m, job.train.trainer, job.train.optim, prec.weight, lora,
                                                       expandable),
        "second_step": second_step(job, prec, lora, phases, block, expandable),
        "head_tile": (head_tile_kept(job, lora, expandable) * min(n, TOKEN_CHUNK_SIZE)
                      * min(m.vocab_size, VOCAB_CHUNK_SIZE) * prec.act + n * m.hidden_size * FP32) if lm_head else 0,
        "layer_blocks": block,
        "allocated": max(p.bytes for p in phases),
    }


def head_tile_kept(job: JobSpec, lora: LoraLayout, expandable: bool) -> bool:
    """Whether the logits tile counts in `head_tile`. Not under expandable segments with LoRA and checkpointing
    (no activation offloading): the frozen head's backward allocates no [V, H] gradient, the freed tile's pages merge
    with the free range around them and the last layer's recompute, next, takes them — in the allocator model's
    replays of ten such streams (five matrix cases, five H200 records: Qwen2.5-0.5B/7B, Llama-3.2-1B, Llama-3.1-8B,
    Gemma-3-1B; SFT and DPO) the largest free range at the peak is 14–84 MiB against a 256 MiB tile, often one fp32
    [4096, H] chunk of the input gradient (14, 32, 64 MiB), which stays in the term. Without checkpointing or with
    activation offloading the activations hold that range and the second step maps the tile again (Qwen2.5-0.5B:
    40–60 and 160–180 MiB of new pages), so the tile stays."""
    t = job.train
    return not (expandable and lora.enabled and t.gradient_checkpointing and not t.activation_offloading)


def second_step(job: JobSpec, prec: Precision, lora: LoraLayout, phases: list[Phase], block: int,
                expandable: bool) -> int:
    """End of the first step's reserve + the [V, H] blocks the second step maps again − the peak (module docstring).
    0 when the states exist before the first step (DeepSpeed allocates them at engine init) or there are none."""
    named = {p.name: p for p in phases}
    forward, optimizer = named.get(FORWARD), named.get(OPTIMIZER_STEP)
    if job.parallel.deepspeed or forward is None or optimizer is None:
        return 0
    states = _bytes(forward, OPTIMIZER_STATES)
    if not states:
        return 0
    peak = max(p.bytes for p in phases)
    blocks = recreated_blocks(job, prec, lora)
    first = max(p.bytes - states for p in phases if p.name == FORWARD or p.name.startswith(BACKWARD))
    if not expandable and not lora.enabled and largest_layer_weight(job.model, job.train.trainer, prec.weight) > block:
        # gradients beside the activations, not in their blocks; the states fill only the freed head blocks
        beside = forward.bytes - states - _bytes(forward, GRADIENTS) + _bytes(optimizer, GRADIENTS)
        end = max(optimizer.bytes, max(first, beside) + max(0, states - blocks))
    else:
        end = max(first, optimizer.bytes)
    return max(0, end + blocks - peak)


def _bytes(phase: Phase, name: str) -> int:
    return sum(c.bytes for c in phase.components if c.name == name)


def recreated_blocks(job: JobSpec, prec: Precision, lora: LoraLayout) -> int:
    """The backward's [V, H] blocks: the fused head's fp32 gradient accumulator and the weight's gradient when the
    head trains; Reward (no LM head): the embedding gradient, and its copy when tied (hpcmem.estimate.step
    `_embedding_backward`). None under LoRA (frozen)."""
    m = job.model
    vh = m.vocab_size * m.hidden_size
    if lora.enabled:
        return 0
    if entry(job.train.trainer).head == "score":
        return (2 if m.tie_word_embeddings else 1) * vh * prec.weight
    return vh * (FP32 + prec.weight)


@functools.lru_cache(maxsize=512)
def largest_layer_weight(m: ModelSpec, trainer: str, weight_bytes: int) -> int:
    """Bytes of the largest decoder-layer parameter tensor (its gradient and AdamW states are as large)."""
    sizes = parameter_sizes(m, trainer, weight_bytes)
    inner = sizes[1:-1]        # the embedding first, the final norm / head / score last
    return max(inner, default=0)


def largest_layer_block(job: JobSpec, mb: MicroBatch, prec: Precision) -> int:
    """The largest tensor a decoder layer's forward or backward allocates: an MLP activation [T, I] in the compute
    dtype, an fp32 [T, H] norm upcast, or — eager attention — an fp32 [rows, heads, S, S] score tensor
    (hpcmem.estimate.activations)."""
    m = job.model
    inter = m.moe_intermediate_size * m.num_experts_per_tok if m.is_moe else m.intermediate_size
    block = mb.tokens * max(inter * prec.act, m.hidden_size * FP32)
    if effective_attention(m, job.train.attn_implementation) == "eager":
        block = max(block, FP32 * m.num_attention_heads * mb.rows * mb.seq * mb.seq)
    return block


def placement_spread(job: JobSpec, prec: Precision, lora: LoraLayout, terms: dict[str, int]) -> int:
    """Bytes of reserved the estimate cannot place (`terms`: the job's allocator mode's `slack_terms`):
    - full fine-tuning: the trainable LM head's [V, H] gradient, when the second step's reserve can set the peak
      (`second_step` > 0). Whether the second step maps that block again depends on which freed block its forward's
      logits tile takes, and in the allocator model replaying the traced streams one 2–8 MiB tensor more or less
      before the weights flips it (full fine-tuning streams move by up to ±6 % of reserved; estimator/LOG.md). 0 for
      heads that are not an LM head and under DeepSpeed (states exist before the first step);
    - LoRA, default segments: a decoder layer's largest block (`layer_blocks`). With the head and the weights frozen
      there is no [V, H] block, but whether one more [T, I]-sized segment gets mapped flips the same way: replayed
      with one 1.5–8 MiB tensor more before the weights, 3 of 17 LoRA streams (the ten H200 records' and seven
      matrix cases') move by about one such block — sft-qwen7b-lora +148 MiB (its bf16 [T, I]: 4096 × 18944 × 2 B),
      sft-llama8b-lora −92 MiB (block 112 MiB), Qwen2.5-0.5B SFT 4 × 2048 −138 MiB (step 2 no longer maps
      peft's fp32 copy of down_proj's input, 152 MiB, twice the bf16 block) — because the 1–10 MiB tensors that
      share 20 MiB segments decide which cached block a smaller request cuts first (estimator/LOG.md). Under
      expandable segments freed ranges merge and no LoRA stream moved by more than one 20 MiB page: 0.
    The fitted rule sits between the two outcomes, so reserved may be off by about half this block either way; the
    estimate says so rather than fit it away."""
    if lora.enabled:
        return 0 if job.expandable_segments else terms["layer_blocks"]
    if entry(job.train.trainer).head != "lm" or terms["second_step"] <= 0:
        return 0
    return job.model.vocab_size * job.model.hidden_size * prec.weight


def spread_block(lora: LoraLayout) -> str:
    """What `placement_spread` names, for the estimate's table."""
    return "a decoder layer's largest block" if lora.enabled else "the head's [V, H] gradient"


def allocator_slack(job: JobSpec, mb: MicroBatch, prec: Precision, lora: LoraLayout,
                    phases: list[Phase]) -> tuple[int, int]:
    """(Σ coefficient × term, never negative; `placement_spread` of the job's allocator mode). The default allocator
    is never estimated below expandable segments: the planner's bound turns expandable segments on to find the least a
    combination can need (hpcmem.plan.best_first). The allocator model disagrees in 17 of the 174 traced steps
    (expandable up to 5.7 % higher), so the estimate takes the larger of the two for the default mode — on the safe
    side."""
    modes = (True,) if job.expandable_segments else (False, True)
    terms = {mode: slack_terms(job, mb, prec, lora, phases, mode) for mode in modes}

    def rule(expandable: bool) -> int:
        coef = COEFFICIENTS["expandable" if expandable else "default"]
        return max(0, int(sum(coef[k] * terms[expandable][k] for k in TERMS)))

    return max(rule(mode) for mode in modes), placement_spread(job, prec, lora, terms[job.expandable_segments])

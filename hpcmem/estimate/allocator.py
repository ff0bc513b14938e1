"""Reserved − allocated at the peak: the caching allocator's slack, from its mechanics (stdlib; no torch).

PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp; modelled in hpcmem/trace/allocator.py) never
returns memory during training: the reserved peak is every segment ever created. Segments are created when no cached
free block fits a request, so reserved exceeds the allocated peak by (a) what segment sizes waste on long-lived
tensors and (b) free blocks stranded at the peak instant — blocks an earlier phase freed that the peak's requests
cannot use. The terms (bytes, `slack_terms`):

- `packing`: (a) — the job's persistent tensors one by one (weights, adapters, AdamW states;
  hpcmem.estimate.tensors) through the allocator's rules (1–10 MiB tensors share 20 MiB segments, larger ones get
  their size rounded up to 2 MiB; expandable segments: 20 MiB pages), exact for them; its coefficient (≈ 2) also
  carries the gradients, which have the same sizes and are carved out during backward;
- `head_gradient`: TRL's fused LM head, when the head trains, accumulates its weight gradient in an fp32 [V, H]
  block (trl/kernels/chunked_logprob.py backward) that is freed before the layers' backward, which split it;
- `head_tile`: the fused head's [4096, 32768] logits tile and fp32 [N, H] input gradient, freed likewise;
- `layer_blocks`: the largest block of a decoder layer (the MLP's [T, I] in the compute dtype, an fp32 [T, H]
  norm upcast, eager attention's fp32 [rows, heads, S, S] scores), a size that recurs layer after layer while
  gradients and saved tensors interleave with it;
- `allocated`: a small share of the peak for everything else (rounding of requests, short-lived blocks).

(b) is not computed from a schedule: each term's coefficient — how much of such a block ends up stranded — is fitted
per allocator mode to the allocator model replaying the trace matrix (`python -m hpcmem.bench.reserved_fit`,
estimator/reserved-fit.json; held-out errors in estimator/LOG.md). Jobs the trace does not run (ZeRO, FSDP: flat
partitions, so no per-tensor `packing`; QLoRA) get the same terms with their own sizes, not held to the allocator
model.
"""

from __future__ import annotations

import bisect
import functools

from hpcmem.estimate.activations import effective_attention
from hpcmem.estimate.lora import LoraLayout
from hpcmem.estimate.loss import TOKEN_CHUNK_SIZE, VOCAB_CHUNK_SIZE
from hpcmem.estimate.shape import MicroBatch, Precision
from hpcmem.estimate.tensors import adapter_sizes, optimizer_state_sizes, parameter_sizes
from hpcmem.spec import JobSpec, ModelSpec
from hpcmem.trace.allocator import (
    K_LARGE_BUFFER,
    K_SMALL_BUFFER,
    K_SMALL_SIZE,
    allocation_size,
    round_size,
    should_split,
)

FP32 = 4
TERMS = ("packing", "head_gradient", "head_tile", "layer_blocks", "allocated")
# Fitted coefficients per allocator mode (python -m hpcmem.bench.reserved_fit; estimator/reserved-fit.json).
COEFFICIENTS: dict[str, dict[str, float]] = {
    "default": {"packing": 2.0801, "head_gradient": 0.1331, "head_tile": 0.0391, "layer_blocks": 1.0096,
                "allocated": 0.0226},
    "expandable": {"packing": 2.4106, "head_gradient": 0.3127, "head_tile": 0.1487, "layer_blocks": 0.9161,
                   "allocated": 0.0058},
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


def slack_terms(job: JobSpec, mb: MicroBatch, prec: Precision, lora: LoraLayout, peak_allocated: int,
                expandable: bool | None = None) -> dict[str, int]:
    """The terms for the job's allocator mode (or the one named by `expandable`)."""
    m, par = job.model, job.parallel
    expandable = job.expandable_segments if expandable is None else expandable
    sharded = par.fsdp or (par.deepspeed and par.zero_stage >= 1)
    head_trains = not lora.enabled and job.train.trainer != "reward"
    n = mb.label_tokens
    lm_head = job.train.trainer != "reward"
    block = largest_layer_block(job, mb, prec)
    return {
        # ZeRO / FSDP keep flat partitions, not one tensor per parameter: no per-tensor packing
        "packing": 0 if sharded else persistent_waste(m, job.train.trainer, job.train.optim, prec.weight, lora,
                                                       expandable),
        "head_gradient": m.vocab_size * m.hidden_size * FP32 if head_trains else 0,
        "head_tile": (min(n, TOKEN_CHUNK_SIZE) * min(m.vocab_size, VOCAB_CHUNK_SIZE) * prec.act
                      + n * m.hidden_size * FP32) if lm_head else 0,
        "layer_blocks": block,
        "allocated": peak_allocated,
    }


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


def allocator_slack(job: JobSpec, mb: MicroBatch, prec: Precision, lora: LoraLayout, peak_allocated: int) -> int:
    """Σ coefficient × term, never negative. The default allocator is never estimated below expandable segments: the
    planner's bound turns expandable segments on to find the least a combination can need (hpcmem.plan.best_first).
    The allocator model disagrees in 17 of the 174 traced steps (expandable up to 5.7 % higher), so the estimate takes
    the larger of the two for the default mode — on the safe side."""
    def rule(expandable: bool) -> int:
        terms = slack_terms(job, mb, prec, lora, peak_allocated, expandable)
        coef = COEFFICIENTS["expandable" if expandable else "default"]
        return max(0, int(sum(coef[k] * terms[k] for k in TERMS)))

    expandable = rule(True)
    return expandable if job.expandable_segments else max(rule(False), expandable)

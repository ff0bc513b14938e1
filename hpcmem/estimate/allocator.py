"""Reserved − allocated at the peak: the caching allocator's slack, from its mechanics (stdlib; no torch).

PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp; modelled in hpcmem/estimate/caching_allocator.py)
never returns memory during training: the reserved peak is every segment ever created. Segments are created when no
cached free block fits a request, so reserved exceeds the allocated peak by (a) what segment sizes waste on long-lived
tensors and (b) free blocks stranded at the peak instant — blocks an earlier phase freed that the peak's requests
cannot use. The terms (bytes, `slack_terms`):

- `packing`: (a) — the job's persistent tensors one by one (weights, adapters, AdamW states;
  hpcmem.estimate.tensors) through the allocator's segment rules (`packing_waste`); its default-mode coefficient
  also carries the gradients, which have the same sizes and are carved out during backward;
- `second_step`: end of step one + the [V, H] blocks the second step maps afresh − the peak, when positive: torch's
  AdamW creates its states at the first `optimizer.step()` (torch/optim/adamw.py `_init_group`) and best fit hands
  them the cached blocks first, so the fused LM head's [V, H] blocks (trl/kernels/chunked_logprob.py backward) get
  new segments in the second step (`second_step`; an untied head's fp32 accumulator twice under gradient
  accumulation: `second_micro_batch_accumulator`);
- `beside` (default segments, full fine-tuning): what step one reserves more when the largest trainable layer weight
  is larger than every block the forward frees: a block never grows past its segment (`try_merge_blocks`), so such
  a weight's gradient and states map segments of their own (`beside_activations`);
- `embedding_grad` (Reward, full fine-tuning): the embedding's [V, H] gradient(s) the second step maps again
  (`embedding_gradients`), counted whole: they land after the allocated peak;
- `head_tile`: the fused head's [4096, 32768] logits tile and fp32 [N, H] input gradient, freed before the layers'
  backward, which split it (`head_tile_kept`);
- `layer_blocks`: the largest block of a decoder layer (`largest_layer_block`);
- `allocated`: a small share of the peak for everything else (rounding of requests, short-lived blocks).
- `accumulated_stacks` (not fitted, coefficient 1; default segments, full fine-tuning of an MoE type with fused
  experts under gradient accumulation): each micro-batch after the first writes a weight's new gradient, adds it
  into .grad and frees it (torch/csrc/autograd/functions/accumulate_grad.h), so the backward's peak holds only the
  largest expert stack's new gradient (hpcmem.estimate.step) while the smaller stacks' freed gradients stay cached:
  a block never serves a larger request (best fit, `get_free_block`), so the largest stack's gradient maps its own
  segment beside them (traced on Mixtral: the [E, H, I] down stack's block). The slack is never below
  `stacks_mapped_again`: the stacks' blocks the second step maps again, since the first step's AdamW states took them.

(b) is not replayed tensor by tensor: each term's coefficient is fitted per allocator mode by hpcmem.lab.reserved_fit
on the trace matrix (estimator/reserved-fit.json; estimator/LOG.md). Jobs the trace does not run (ZeRO, FSDP: flat
partitions, so no per-tensor `packing`; QLoRA) get the same terms with their own sizes.
"""

from __future__ import annotations

import bisect
import functools

from hpcmem.estimate.activations import effective_attention
from hpcmem.estimate.breakdown import Phase
from hpcmem.estimate.caching_allocator import (
    K_LARGE_BUFFER,
    K_SMALL_BUFFER,
    K_SMALL_SIZE,
    allocation_size,
    round_size,
    should_split,
)
from hpcmem.estimate.lora import LoraLayout, lora_layout
from hpcmem.estimate.loss import logits_tile
from hpcmem.estimate.names import (
    AUTOCAST_CACHE,
    BACKWARD,
    GRADIENTS,
    OPTIMIZER_STATES,
    OPTIMIZER_STEP,
    OPTIMIZER_TEMPORARIES,
    is_forward,
)
from hpcmem.estimate.names import CUBLAS_WORKSPACES as WORKSPACES
from hpcmem.estimate.states import FOREACH_OPTIMS, param_parts
from hpcmem.estimate.tensors import adapter_sizes, optimizer_state_sizes, parameter_sizes
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import MicroBatch, Precision
from hpcmem.job.trainers import entry
from hpcmem.models.profile import LearnedProfile, pieces
from hpcmem.models.spec import ModelSpec

FP32 = 4
TERMS = ("packing", "second_step", "head_tile", "layer_blocks", "allocated", "beside", "embedding_grad")
# Fitted coefficients per allocator mode: least absolute deviations on the training split (python -m
# hpcmem.lab.reserved_fit; estimator/reserved-fit.json).
COEFFICIENTS: dict[str, dict[str, float]] = {
    "default": {"packing": 1.7049, "second_step": 0.6515, "head_tile": 0.1658, "layer_blocks": 1.198,
                "allocated": 0.0054, "beside": 0.9995, "embedding_grad": 0.4782},
    "expandable": {"packing": 2.6364, "second_step": 0.4042, "head_tile": 0.2654, "layer_blocks": 1.0415,
                   "allocated": 0.0, "beside": 0.0, "embedding_grad": 0.3155},
}


def packing_waste(sizes: tuple[int, ...], expandable: bool) -> int:
    """Reserved − the rounded requests after allocating `sizes` in order with nothing freed: the allocator model's
    rules (hpcmem.estimate.caching_allocator: 512 B rounding, best fit, split rules, segment sizes) specialised to
    allocations that live forever — each pool is then just the sorted remainders of its segments. Expandable segments
    map pages as the one region grows: only the last page of each pool is partly empty."""
    reserved, _, requested, _ = _pack(sizes, expandable)
    return reserved - requested


def packing_tails(sizes: tuple[int, ...], expandable: bool) -> int:
    """Allocated − the requests after allocating `sizes` in order with nothing freed: torch counts a block's whole
    size in `allocated_bytes` (c10/cuda/CUDACachingAllocator.cpp `malloc`: `stats.allocated_bytes` += `block->size`,
    after `alloc_found_block`), and the large pool hands a block out unsplit when the remainder is ≤ 1 MiB
    (`should_split`: `remaining > kSmallSize`). So a tensor just under a 2 MiB multiple (its own rounded-up segment)
    or one that best fit puts into a cached remainder < its size + 1 MiB counts up to 1 MiB more than its bytes.
    Plus the 512 B rounding of every request (`round_size`). Expandable segments split any remainder ≥ 512 B:
    rounding only."""
    _, allocated, _, raw = _pack(sizes, expandable)
    return allocated - raw


def _pack(sizes: tuple[int, ...], expandable: bool) -> tuple[int, int, int, int]:
    """(reserved, allocated, Σ rounded requests, Σ requests) of `sizes` allocated in order, never freed (the model's
    rules)."""
    large: list[int] = []
    small: list[int] = []
    reserved = allocated = requested = small_total = large_total = 0
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
            allocated += size
        else:
            allocated += block
    if expandable:
        reserved = _pages(small_total, K_SMALL_BUFFER) + _pages(large_total, K_LARGE_BUFFER)
        allocated = requested
    return reserved, allocated, requested, sum(sizes)


def _pages(nbytes: int, page: int) -> int:
    return -(-nbytes // page) * page


def persistent_sizes(m: ModelSpec, trainer: str, optim: str, weight_bytes: int, lora: LoraLayout) -> tuple[int, ...]:
    """A single-GPU job's weights, adapters and AdamW states, in allocation order (hpcmem.estimate.tensors)."""
    base = parameter_sizes(m, trainer, weight_bytes)
    adapters = adapter_sizes(lora)
    trainable = adapters if lora.enabled else base
    return (*base, *adapters, *optimizer_state_sizes(optim, list(trainable)))


@functools.lru_cache(maxsize=512)
def _persistent_pack(m: ModelSpec, trainer: str, optim: str, weight_bytes: int, lora: LoraLayout,
                     expandable: bool) -> tuple[int, int, int, int]:
    """`_pack` of `persistent_sizes`, walked once for both its waste and its tails (cached: the planner asks for the
    same model many times)."""
    return _pack(persistent_sizes(m, trainer, optim, weight_bytes, lora), expandable)


def persistent_waste(m: ModelSpec, trainer: str, optim: str, weight_bytes: int, lora: LoraLayout,
                     expandable: bool) -> int:
    """`packing_waste` of `persistent_sizes`."""
    reserved, _, requested, _ = _persistent_pack(m, trainer, optim, weight_bytes, lora, expandable)
    return reserved - requested


def persistent_tails(m: ModelSpec, trainer: str, optim: str, weight_bytes: int, lora: LoraLayout,
                     expandable: bool) -> int:
    """`packing_tails` of `persistent_sizes`: what torch's allocated count holds beyond those tensors' bytes."""
    _, allocated, _, raw = _persistent_pack(m, trainer, optim, weight_bytes, lora, expandable)
    return allocated - raw


def slack_terms(job: JobSpec, mb: MicroBatch, prec: Precision, lora: LoraLayout, phases: list[Phase],
                expandable: bool | None = None) -> dict[str, int]:
    """The terms for the job's allocator mode (or the one named by `expandable`); `phases`: the estimate's (hpcmem.
    estimate.step), the peak allocated being the largest."""
    m = job.model
    expandable = job.expandable_segments if expandable is None else expandable
    sharded = job.parallel.flat_partitions
    lm_head = entry(job.train.trainer).head == "lm"
    n = mb.label_tokens
    block = largest_layer_block(job, mb, prec)
    ordinary = second_step(job, mb, prec, lora, phases, expandable)
    reward = embedding_grad(job, prec, lora, phases)
    return {
        # ZeRO / FSDP keep flat partitions, not one tensor per parameter: no per-tensor packing
        "packing": 0 if sharded else persistent_waste(m, job.train.trainer, job.train.optim, prec.weight, lora,
                                                       expandable),
        "second_step": ordinary,
        "head_tile": (head_tile_kept(job, lora, expandable) * logits_tile(n, m.vocab_size, prec.act)
                      + n * m.hidden_size * FP32) if lm_head else 0,
        "layer_blocks": block,
        "allocated": max(p.bytes for p in phases),
        # per-tensor placement: not for ZeRO / FSDP's flat partitions either
        "beside": 0 if expandable or sharded else max(0, beside_activations(job, mb, prec, lora, phases, block)
                                                       - ordinary - reward),
        "embedding_grad": reward,
    }


def accumulated_stacks(job: JobSpec, prec: Precision, lora: LoraLayout, expandable: bool) -> int:
    """The `accumulated_stacks` term (module docstring): not fitted, so outside `slack_terms` and the fit's slack."""
    if job.train.gradient_accumulation_steps == 1 or lora.enabled or job.parallel.flat_partitions or expandable:
        return 0
    return param_parts(job.model).moe_stack_rest * prec.weight


def head_tile_kept(job: JobSpec, lora: LoraLayout, expandable: bool) -> bool:
    """Whether the logits tile counts in `head_tile`. Not under expandable segments with LoRA and checkpointing
    (no activation offloading): the frozen head's backward allocates no [V, H] gradient, the freed tile's pages merge
    with the free range around them and the last layer's recompute, next, takes them. Without checkpointing or with
    activation offloading the activations hold that range and the second step maps the tile again, so the tile stays.
    It stays too when LoRA trains a copy of the head (`lora_modules_to_save: [lm_head]`): the head's backward then
    allocates its [V, H] gradients (hpcmem.estimate.lora_variants), as in full fine-tuning."""
    t = job.train
    frozen_head = lora.enabled and not lora.trains_head
    return not (expandable and frozen_head and t.gradient_checkpointing and not t.activation_offloading)


def second_step(job: JobSpec, mb: MicroBatch, prec: Precision, lora: LoraLayout, phases: list[Phase],
                expandable: bool) -> int:
    """End of the first step's reserve + the [V, H] blocks the second step maps again − the peak (module docstring).
    0 when the states exist before the first step (DeepSpeed allocates them at engine init) or there are none, and for
    Reward (`embedding_grad`)."""
    reserve = step_two_reserve(job, mb, prec, lora, phases, expandable)
    return 0 if reserve is None else max(0, reserve - max(p.bytes for p in phases))


def step_two_reserve(job: JobSpec, mb: MicroBatch, prec: Precision, lora: LoraLayout, phases: list[Phase],
                     expandable: bool, again: int = 0) -> int | None:
    """End of the first step's reserve + the blocks the second step maps again (the [V, H] blocks, and `again` more);
    None where `second_step` is 0 by rule."""
    step = None if entry(job.train.trainer).head == "score" else first_step(job, phases)
    if step is None:
        return None
    forward, optimizer, states = step
    blocks = recreated_blocks(job, prec, lora) + again
    if (blocks and not expandable and not job.parallel.flat_partitions
            and not head_gradient_mapped_again(job, mb, prec)):
        blocks -= job.model.vocab_size * job.model.hidden_size * prec.weight
    blocks += second_micro_batch_accumulator(job, lora, expandable)
    if expandable and job.train.optim in FOREACH_OPTIMS:
        # foreach AdamW's temporaries, freed last, leave one free run at the top of the mapped range, which best fit
        # hands out last (it can grow): the second step's [V, H] blocks land in it before pages are mapped (clipping's
        # 512-byte norms, the fused step's only temporaries, sit in the small pool and host nothing)
        blocks = max(0, blocks - _bytes(optimizer, OPTIMIZER_TEMPORARIES))
    first = max(p.bytes - states for p in phases if is_forward(p.name) or p.name.startswith(BACKWARD))
    return max(first, optimizer.bytes) + blocks


def stacks_mapped_again(job: JobSpec, mb: MicroBatch, prec: Precision, lora: LoraLayout, phases: list[Phase]) -> int:
    """Where `accumulated_stacks` applies (default segments, full fine-tuning of fused expert stacks under gradient
    accumulation): the least slack the second step leaves, not fitted. Step one's later micro-batches write each
    stack's new gradient and free it; the first `optimizer.step()` then creates the AdamW states (torch/optim/adamw.py
    `_init_group`), and best fit (c10/cuda/CUDACachingAllocator.cpp `get_free_block`) hands them those cached
    blocks of exactly their size, so the second step's later micro-batches map a block for the largest stack's new
    gradient and one for the rest again, beside the [V, H] blocks `second_step` counts: the reserve reaches the end of
    step one + all of them (traced: MiMo-V2-Flash, 3 layers, accumulation 2 — step two maps 2.3 + 1.2 GB for the head
    and 4.3 + 8.6 GB for a layer's two stacks; estimator/LOG.md). Less the peak, which holds the largest one."""
    if not accumulated_stacks(job, prec, lora, False):
        return 0
    parts = param_parts(job.model)
    again = (parts.moe_stack_rest + parts.largest_moe_tensor) * prec.weight
    reserve = step_two_reserve(job, mb, prec, lora, phases, False, again)
    return 0 if reserve is None else max(0, reserve - max(p.bytes for p in phases))


def second_micro_batch_accumulator(job: JobSpec, lora: LoraLayout, expandable: bool) -> int:
    """Default segments, full fine-tuning of an untied LM head under gradient accumulation: the fused head's fp32
    [V, H] accumulator (trl/kernels/chunked_logprob.py `ChunkedLogProbFunction.backward`) the second step maps a second
    time, in its second micro-batch. The first micro-batch's backward re-creates every gradient (zero_grad set them to
    None; torch/csrc/autograd/functions/accumulate_grad.h `accumulateGrad` keeps the incoming tensor as `.grad`) and
    best fit (c10/cuda/CUDACachingAllocator.cpp `get_free_block`) cuts them, and the second micro-batch's saved
    tensors, from the largest free block — the first micro-batch's freed accumulator — so the second one's request no
    longer fits there; from the third on the gradients are added in place and that block stays whole. With tied
    weights the embedding's backward frees a dense [V, H] gradient at the end of the first micro-batch (aten/src/ATen/
    native/Embedding.cpp `embedding_dense_backward`), which can take those cuts instead: whether it does depends on the
    layers' gradients, so tied heads get none here (the tied block stays in `placement_spread`)."""
    t = job.train
    if (expandable or lora.enabled or t.gradient_accumulation_steps <= 1 or job.model.tie_word_embeddings
            or job.parallel.flat_partitions or entry(t.trainer).head != "lm"):
        return 0
    return job.model.vocab_size * job.model.hidden_size * FP32


def head_gradient_mapped_again(job: JobSpec, mb: MicroBatch, prec: Precision) -> bool:
    """Default segments, a trained LM head: whether the second step maps the head's [V, H] gradient (weights' dtype)
    again, beside the fp32 [V, H] accumulator. The fused head's backward (trl/kernels/chunked_logprob.py
    `ChunkedLogProbFunction.backward`) allocates the fp32 accumulator, then the logits tile, and the [V, H] gradient
    (`grad_weight.to(weight.dtype)`) last, while both are alive; best fit (c10/cuda/CUDACachingAllocator.cpp
    `get_free_block`: the smallest cached block that holds the request; `alloc_found_block` caches the rest) serves
    each. Two large blocks are free then: step one's gradient segment, V·H·w (freed by zero_grad), and the rest of
    step one's accumulator segment after an AdamW [V, H] state took its front (torch/optim/adamw.py `_init_group`),
    V·H·(4 − w), less what the forward cut from it — taken as one layer block. When that rest is smaller than the
    tile and the tile fits the gradient's segment, the tile takes it and the gradient maps a new one; otherwise the
    tile takes the rest (or the rest holds the gradient) and nothing is mapped for it. Not exact: the forward may cut
    more or less than one block (`placement_spread`). With fp32 weights there is no such block: `Tensor.to` returns
    the tensor itself when the dtype matches."""
    if prec.weight == FP32:
        return False        # fp32 weights: `grad_weight.to(weight.dtype)` returns the accumulator itself
    m = job.model
    vh = m.vocab_size * m.hidden_size
    tile = allocation_size(round_size(logits_tile(mb.label_tokens, m.vocab_size, prec.act)))
    left = vh * (FP32 - prec.weight) - largest_layer_block(job, mb, prec)
    return left < tile <= vh * prec.weight


def embedding_grad(job: JobSpec, prec: Precision, lora: LoraLayout, phases: list[Phase]) -> int:
    """Reward, full fine-tuning: the embedding's [V, H] gradient blocks the second step may map again
    (`embedding_gradients`), counted whole — they come after the allocated peak (module docstring). 0 for other heads,
    under LoRA (frozen embedding) and where the first `optimizer.step()` does not create the states (DeepSpeed)."""
    if entry(job.train.trainer).head != "score" or first_step(job, phases) is None:
        return 0
    return recreated_blocks(job, prec, lora)


def beside_activations(job: JobSpec, mb: MicroBatch, prec: Precision, lora: LoraLayout, phases: list[Phase],
                       block: int) -> int:
    """Default segments: end of step one + the [V, H] block step 2 maps again − the peak, for a full fine-tuning job
    whose largest layer weight is larger than every block the forward frees (module docstring, `beside`); 0 when
    none is, under LoRA and DeepSpeed, or without states. The blocks the forward frees: autocast's 16-bit copy of
    each layer weight (fp32 weights under checkpointing), the fused gate/up projection's [T, 2I] output (Phi-3; one
    layer's under checkpointing), and the rest of the activations as blocks of the layer's largest size (`block`).
    The gradients and optimizer states are placed in them whole (`_placed`); the rest maps segments of its own.
    Under gradient accumulation the gradients already exist in the forward phase: counted once, not freed by it."""
    step = None if lora.enabled else first_step(job, phases)
    if step is None:
        return 0
    m, trainer = job.model, job.train.trainer
    freed = forward_freed(job, mb, prec, step[0])
    if largest_layer_weight(m, trainer, prec.weight) <= max([block, *freed]):
        return 0
    end = placed_end(job, prec, step, block, freed)
    lm_head = entry(trainer).head == "lm"
    again = m.vocab_size * m.hidden_size * prec.weight if lm_head else recreated_blocks(job, prec, lora)
    return max(0, end + again - max(p.bytes for p in phases))


def forward_freed(job: JobSpec, mb: MicroBatch, prec: Precision, forward: Phase) -> dict[int, int]:
    """(block size → count) of the blocks step one's forward frees that `beside_activations` names before the layer
    blocks: autocast's 16-bit weight copies and the fused gate/up outputs."""
    m = job.model
    sizes = parameter_sizes(m, job.train.trainer, prec.weight)
    freed: dict[int, int] = {}
    if _bytes(forward, AUTOCAST_CACHE):
        for size in sizes[1:-1]:
            copy = size * prec.act // prec.weight
            freed[copy] = freed.get(copy, 0) + 1
    if m.fused_gate_up:
        gate_up = mb.tokens * 2 * m.intermediate_size * prec.act
        freed[gate_up] = freed.get(gate_up, 0) + (1 if job.train.gradient_checkpointing else m.num_hidden_layers)
    return freed


def placed_end(job: JobSpec, prec: Precision, step: tuple[Phase, Phase, int], block: int,
               freed: dict[int, int]) -> int:
    """End of step one's reserve when every gradient and AdamW state of a full fine-tuning job is placed whole into
    the blocks the forward freed (`freed`, plus the rest of the activations as `block`-sized blocks; best fit,
    `_placed`) and the rest maps segments of its own (`beside_activations`); `step`: `first_step`."""
    forward, optimizer, states = step
    trainer = job.train.trainer
    freed = dict(freed)
    kept = _bytes(forward, GRADIENTS)       # gradient accumulation: the gradients exist through the forward
    # what stays through the optimizer step is not freed by the forward: the weights, and a reference or teacher
    # model, DDP's gradient buckets, a vLLM pool (the phases' resident components, hpcmem.estimate.step); the cuBLAS
    # workspaces (64 MiB, under one block) stay in the rest, as the coefficients were fitted
    resident = {c.name for c in optimizer.components} - {GRADIENTS, WORKSPACES}
    held = sum(c.bytes for c in forward.components if c.name in resident and c.name != OPTIMIZER_STATES)
    rest = forward.bytes - states - kept - held - sum(k * n for k, n in freed.items())
    if rest >= block > 0:
        freed[block] = freed.get(block, 0) + rest // block
    trained = _trained(job.model, trainer, job.train.optim, prec.weight)
    total = sum(k * n for k, n in trained)
    return max(optimizer.bytes, forward.bytes - states - kept + total - _placed(freed, dict(trained)))


@functools.lru_cache(maxsize=512)
def _trained(m: ModelSpec, trainer: str, optim: str, weight_bytes: int) -> tuple[tuple[int, int], ...]:
    """(size, count) of every trainable tensor's gradient and optimizer states (full fine-tuning)."""
    out: dict[int, int] = {}
    for size in parameter_sizes(m, trainer, weight_bytes):
        for t in (size, *optimizer_state_sizes(optim, [size])):
            out[t] = out.get(t, 0) + 1
    return tuple(out.items())


def _placed(freed: dict[int, int], tensors: dict[int, int]) -> int:
    """Bytes of `tensors` (size → count) the `freed` blocks (size → count) hold, whole tensors only: largest tensors
    first, each into the smallest block that fits (best fit); a block keeps taking tensors of that size, and the
    remainder stays a free block when the large pool would split it (> 1 MiB; hpcmem.estimate.caching_allocator
    `should_split`)."""
    free = dict(freed)
    placed = 0
    for size in sorted(tensors, reverse=True):
        want = tensors[size]
        while want:
            fits = [k for k, n in free.items() if n and k >= size]
            if not fits:
                break
            room = min(fits)
            per = room // size
            used = min(free[room], -(-want // per))
            took = min(want, used * per)
            want -= took
            placed += took * size
            free[room] -= used
            last = took - (used - 1) * per          # tensors in the last block used
            for left, count in ((room - per * size, used - 1), (room - last * size, 1)):
                if count and should_split(room, room - left, False, False):
                    free[left] = free.get(left, 0) + count
    return placed


def first_step(job: JobSpec, phases: list[Phase]) -> tuple[Phase, Phase, int] | None:
    """(forward, optimizer step, the optimizer states' bytes) when the first `optimizer.step()` creates the states
    (torch/optim/adamw.py `_init_group`); None under DeepSpeed (states made at engine init), without a forward or
    optimizer phase, or without states."""
    forward = next((p for p in phases if is_forward(p.name)), None)
    optimizer = next((p for p in phases if p.name == OPTIMIZER_STEP), None)
    if job.parallel.deepspeed or forward is None or optimizer is None:
        return None
    states = _bytes(forward, OPTIMIZER_STATES)
    return (forward, optimizer, states) if states else None


def _bytes(phase: Phase, name: str) -> int:
    return sum(c.bytes for c in phase.components if c.name == name)


def recreated_blocks(job: JobSpec, prec: Precision, lora: LoraLayout) -> int:
    """The backward's [V, H] blocks: the fused head's fp32 gradient accumulator and the weight's gradient when the
    head trains; Reward (no LM head): `embedding_gradients` [V, H] gradients in the weights' dtype. None under LoRA
    (frozen)."""
    m = job.model
    vh = m.vocab_size * m.hidden_size
    if lora.enabled:
        return 0
    if entry(job.train.trainer).head == "score":
        return embedding_gradients(job) * vh * prec.weight
    return vh * (FP32 + prec.weight)


def embedding_gradients(job: JobSpec) -> int:
    """[V, H] embedding gradients one Reward step holds at once: the embedding's backward allocates a fresh dense
    gradient each micro-batch (torch/nn/functional.py `embedding` → aten/src/ATen/native/Embedding.cpp
    `embedding_dense_backward`); the first becomes `.grad` (zero_grad set it to None; torch/csrc/autograd/functions/
    accumulate_grad.h `AccumulateGrad::accumulateGrad` keeps the incoming tensor), each later one is added into it
    in place and freed — so 1 without gradient accumulation and 2 with it, whatever the accumulation steps. Tying
    adds none: the sequence-classification model (transformers `AutoModelForSequenceClassification`, a [labels, H]
    `score` linear) has no output embedding to tie."""
    return 2 if job.train.gradient_accumulation_steps > 1 else 1


@functools.lru_cache(maxsize=512)
def largest_layer_weight(m: ModelSpec, trainer: str, weight_bytes: int) -> int:
    """Bytes of the largest decoder-layer parameter tensor (its gradient and AdamW states are as large)."""
    sizes = parameter_sizes(m, trainer, weight_bytes)
    inner = sizes[1:-1]        # the embedding first, the final norm / head / score last
    return max(inner, default=0)


def largest_layer_block(job: JobSpec, mb: MicroBatch, prec: Precision) -> int:
    """The largest tensor a decoder layer's forward or backward allocates: an MLP activation [T, I] in the compute
    dtype, an fp32 [T, H] norm upcast, or — eager attention — an fp32 [rows, heads, S, S] score tensor
    (hpcmem.estimate.activations; transformers' `eager_attention_forward`, e.g. models/llama/modeling_llama.py:
    `softmax(attn_weights, dim=-1, dtype=torch.float32)`).

    A learned profile traced with eager attention (`learned_eager`), or whose layers took SDPA's math path
    (`learned_math_scores`), counts the score tensor under gradient checkpointing only. There the scores are the
    recompute's transients: each layer's forward and recompute allocate and free them, and the sizes differ (the
    scores and, with attention sinks, the scores with one more column, `torch.cat([attn_weights, sinks], dim=-1)` in
    e.g. models/flint/modeling_flint.py), so a freed block of one size cannot serve a larger request (best fit,
    c10/cuda/CUDACachingAllocator.cpp `get_free_block`) and each maps a segment of its own — segments beyond what
    the allocated peak holds. Without checkpointing every layer saves its probabilities for the backward, so the
    segments the scores mapped are held at the peak, which the allocated estimate already counts."""
    m = job.model
    inter = m.moe_intermediate_size * m.num_experts_per_tok if m.is_moe else m.intermediate_size
    block = mb.tokens * max(inter * prec.act, m.hidden_size * FP32)
    if effective_attention(m, job.train.attn_implementation) == "eager" or (
            job.train.gradient_checkpointing and (learned_eager(m.learned)
                                                  or learned_math_scores(m.learned, m.num_attention_heads))):
        block = max(block, FP32 * m.num_attention_heads * mb.rows * mb.seq * mb.seq)
    if job.train.use_peft:
        # a wrapped parameter's W + ΔW (lora.ParamWrapper: a fused expert stack in the weights' dtype), made in each
        # layer's forward and recompute and freed after its backward (hpcmem.estimate.lora_variants)
        block = max(block, *(w.in_features * w.out_features * w.count_per_layer * prec.weight
                             for w in lora_layout(job).targeted), 0)
    return block


@functools.lru_cache(maxsize=64)
def learned_eager(p: LearnedProfile | None) -> bool:
    """A learned profile whose layers build attention scores: traced where transformers chose eager attention (the
    model declares no SDPA kernel; hpcmem.trace.layer_map records `config._attn_implementation` as the profile's
    provenance "attention") and whose layer peaks grow with rows·seq² (hpcmem.models.profile `Poly.c`; a
    state-space layer such as Mamba's reports "eager" too but has no such term)."""
    if p is None or p.provenance.get("attention") != "eager":
        return False
    return any(piece.c >= 1 for cell in p.cells.values() for term in cell.peak
               for piece in pieces(term))


@functools.lru_cache(maxsize=64)
def learned_math_scores(p: LearnedProfile | None, heads: int) -> bool:
    """A learned profile whose checkpointed layer peak grows by at least three fp32 [rows, heads, S, S] tensors per
    rows·seq² (hpcmem.models.profile `Poly.c`, bytes): the signature of SDPA's math path, which upcasts 16-bit q, k
    and v to fp32 and keeps the fp32 scores, their masked sum and the softmax alive at once (torch 2.13
    `_scaled_dot_product_attention_math`: `_to_copy`, `bmm`, `add`, `_safe_softmax`, read off the ops of a CPU call).
    SDPA falls back to it where the fused kernels refuse the call whatever the profile's provenance says ("sdpa"):
    Falcon's multi-query keys reach it with one head and no `enable_gqa` (modeling_falcon.py `FalconAttention.forward`;
    the fused kernels check equal batch and head counts, sdp_utils.cpp `check_batch_size_and_num_heads_dense`).
    Eager profiles pass it too (`learned_eager` counts them already). A sparse-attention indexer's [rows, S, S] or
    [rows, S, index heads, S] scores (GLM-MoE-DSA, AXK2) stay under it: their largest block is not a score tensor of
    every attention head."""
    if p is None or heads <= 0:
        return False
    return any(piece.c >= 3 * FP32 * heads for key, cell in p.cells.items() if key.split("/")[2] == "gc"
               for term in cell.peak for piece in pieces(term))


def placement_spread(job: JobSpec, mb: MicroBatch, prec: Precision, lora: LoraLayout, terms: dict[str, int]) -> int:
    """Bytes of reserved the estimate cannot place: a block whose segment the second step may or may not map again,
    depending on which cached block an earlier request cut (best fit, c10/cuda/CUDACachingAllocator.cpp
    `get_free_block`) — an order the estimate does not replay. The fitted rule sits between the two outcomes, so
    reserved may be off by about half this block either way; the estimate says so rather than fit it away.
    - A trainable LM head: its [V, H] gradient (in the weights' dtype), when the second step's reserve can set the
      peak (`second_step` or `beside` > 0 in `terms`, the job's allocator mode's `slack_terms`): whether the second
      step maps it again depends on which freed block its forward's logits tile takes. With tied 16-bit weights under
      default segments the same-sized block is also reported where the head's gradient keeps its segment
      (`head_gradient_mapped_again` false), whatever `second_step`: the embedding's own [V, H] gradient, the
      backward's last block, may need a new segment then (`tied_embedding_block`).
    - Reward (a score head): the embedding's [V, H] gradient (one block also with gradient accumulation). It is the
      backward's last block, so when it needs a new segment that lands on the reserve the layers' backward reached,
      after the allocated peak. Step one's gradient segment, freed by zero_grad, is still whole then unless the second
      step's layer blocks have cut it — which depends on the free blocks step one's AdamW states left. Without
      accumulation, under default segments with checkpointing, a decoder layer's largest block (`layer_blocks`) is
      added: the second step's layer blocks flip too (`reward_layer_coin`).
    - LoRA, default segments: a decoder layer's largest block (`layer_blocks`). With the head and the weights frozen
      there is no [V, H] block, but whether one more [T, I]-sized segment gets mapped flips the same way, because the
      1–10 MiB tensors that share 20 MiB segments decide which cached block a smaller request cuts first. Under
      expandable segments freed ranges merge: 0.
    0 for other heads, and no [V, H] block under DeepSpeed (states exist before the first step)."""
    head = entry(job.train.trainer).head
    if lora.enabled:
        return 0 if job.expandable_segments else terms["layer_blocks"]
    if job.parallel.deepspeed or head not in ("lm", "score"):
        return 0
    if head == "lm" and terms["second_step"] + terms["beside"] <= 0 and not tied_embedding_block(job, mb, prec, lora):
        return 0
    vh = job.model.vocab_size * job.model.hidden_size * prec.weight
    if head == "score" and reward_layer_coin(job):
        return vh + terms["layer_blocks"]
    return vh


def reward_layer_coin(job: JobSpec) -> bool:
    """Reward full fine-tuning, default segments, checkpointing, no gradient accumulation: whether a decoder layer's
    largest block joins the embedding's [V, H] gradient in `placement_spread`. torch's AdamW creates its states at
    the first `optimizer.step()` (torch/optim/adamw.py `_init_group`), after the first backward has freed the layers'
    working blocks; best fit (c10/cuda/CUDACachingAllocator.cpp `get_free_block`) puts the states, each smaller than
    those blocks, into them and `alloc_found_block` caches the pieces; the second step's recompute and backward of
    the peak layer find only pieces and map such blocks again, how many depending on which piece each state cut.
    Under gradient accumulation the micro-batches reuse each other's blocks, so none is added. Expandable segments,
    jobs without checkpointing and flat partitions (ZeRO, FSDP): none added (not modelled; estimator/LOG.md)."""
    return (not (job.expandable_segments or job.parallel.flat_partitions) and job.train.gradient_checkpointing
            and job.train.gradient_accumulation_steps == 1)


def tied_embedding_block(job: JobSpec, mb: MicroBatch, prec: Precision, lora: LoraLayout) -> bool:
    """Default segments, full fine-tuning of a tied LM head in 16-bit weights: whether the embedding's own [V, H]
    gradient can need a new segment in the second step, whatever `second_step` says. With tied weights `.grad`
    already holds the head's gradient when the embedding's backward runs — the backward's last block, after every
    layer — so that backward allocates a dense [V, H] gradient beside it (aten/src/ATen/native/Embedding.cpp
    `embedding_dense_backward`), which AccumulateGrad adds in place and frees (torch/csrc/autograd/functions/
    accumulate_grad.h `accumulateGrad`). The largest free block then is what the layers' backward left of the
    fp32 accumulator's segment (V·H·4, mapped again at the start of the second step's backward: `second_step`);
    when it is below V·H·w the gradient maps a segment of its own, on top of the reserve the layers' backward
    reached — the end of the second step, not of the first. Which side a job falls on moves with small changes of
    the free blocks, so it is reported as the spread, not fitted. fp32 weights: the embedding's fp32 gradient maps
    again every step and `recreated_blocks` counts it (no coin); expandable segments: not modelled
    (estimator/LOG.md)."""
    return (not job.expandable_segments and not lora.enabled and prec.weight < FP32 and job.model.tie_word_embeddings
            and entry(job.train.trainer).head == "lm" and not job.parallel.flat_partitions
            and not head_gradient_mapped_again(job, mb, prec))


def spread_block(job: JobSpec, mb: MicroBatch, prec: Precision, lora: LoraLayout) -> str:
    """What `placement_spread` names, for the estimate's table."""
    if lora.enabled:
        return "a decoder layer's largest block"
    if entry(job.train.trainer).head == "score":
        return ("the embedding's [V, H] gradient and a decoder layer's largest block" if reward_layer_coin(job)
                else "the embedding's [V, H] gradient")
    if tied_embedding_block(job, mb, prec, lora):
        return "the head's or the tied embedding's [V, H] gradient"
    return "the head's [V, H] gradient"


def allocator_slack(job: JobSpec, mb: MicroBatch, prec: Precision, lora: LoraLayout,
                    phases: list[Phase]) -> tuple[int, int]:
    """(Σ coefficient × term, never negative; `placement_spread` of the job's allocator mode). The default allocator
    is never estimated below expandable segments: the planner's bound turns expandable segments on to find the least a
    combination can need (hpcmem.plan.best_first), so the estimate takes the larger of the two rules for the default
    mode — on the safe side."""
    modes = (True,) if job.expandable_segments else (False, True)
    terms = {mode: slack_terms(job, mb, prec, lora, phases, mode) for mode in modes}

    def rule(expandable: bool) -> int:
        coef = COEFFICIENTS["expandable" if expandable else "default"]
        summed = int(sum(coef[k] * terms[expandable][k] for k in TERMS)
                     + accumulated_stacks(job, prec, lora, expandable))
        return max(0, summed, 0 if expandable else stacks_mapped_again(job, mb, prec, lora, phases))

    return max(rule(mode) for mode in modes), placement_spread(job, mb, prec, lora, terms[job.expandable_segments])

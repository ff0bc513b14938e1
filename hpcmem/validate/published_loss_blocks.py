"""The full-logits loss's logit-sized blocks under PyTorch's caching allocator: what they reserve beyond what they
hold at once, replayed through hpcmem.estimate.caching_allocator at the row's sizes.

The loss allocates a handful of [tokens, vocab] tensors of three sizes — bf16 logits (2 B per element), fp32 (4 B),
and, where the loop shifts the logits before the loss, fp32 over one position fewer per row (4 B over
(tokens − rows) × vocab). The caching allocator hands a freed block only to a request it fits, and a large block whose
remainder would be ≤ 1 MiB is handed out whole (`should_split`), so a block freed by an earlier tensor of another
size may be left stranded while a new segment is made. The events below are the tensors' births and deaths in the
order the code makes them (the logit-sized ones; the loss's other tensors, the shifted labels and scalars, are at
most 8 B per token against 64 kB of bf16 logits per token at Llama-2's vocabulary), recorded by hpcmem.trace.tracker on
the code itself (tests/validate/test_published_loss_blocks.py compares them):

    model-loss-4.4x  transformers 4.36–4.45 LlamaForCausalLM.forward with labels: `self.lm_head(...)` (bf16),
                     `logits.float()` (the bf16 one dies), `logits[..., :-1, :].contiguous()`, CrossEntropyLoss's
                     log_softmax (the shifted copy dies with the forward's locals); backward: nll_loss's gradient,
                     log_softmax's (then both the first and log_softmax's saved output die), the slice's full-size
                     gradient, the cast back to bf16.
    model-loss       transformers ≥ 4.46 loss_utils.ForCausalLMLoss: bf16 logits (kept by the output), `logits.float()`,
                     log_softmax (the fp32 copy dies); backward: nll_loss's gradient, log_softmax's, the bf16 cast.

`kept` is the tensor the model's output holds after the backward (4.4x: the fp32 logits; ≥ 4.46: the bf16 ones): a
loop that keeps the output through the backward (Answer.AI's train.py sets `output = None` only after the optimizer
step) holds it in every later phase.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcmem.estimate.caching_allocator import CachingAllocator

# (event, tensor, size kind): size kinds "bf16" 2·T·V, "fp32" 4·T·V, "fp32-shifted" 4·(T − rows)·V
LOSS_EVENTS: dict[str, tuple[tuple[str, str, str], ...]] = {
    "model-loss-4.4x": (
        ("malloc", "logits", "bf16"), ("malloc", "logits.float", "fp32"), ("free", "logits", ""),
        ("malloc", "shift_logits", "fp32-shifted"), ("malloc", "log_softmax", "fp32-shifted"),
        ("free", "shift_logits", ""),
        ("malloc", "nll grad", "fp32-shifted"), ("malloc", "log_softmax grad", "fp32-shifted"),
        ("free", "nll grad", ""), ("free", "log_softmax", ""),
        ("malloc", "slice grad", "fp32"), ("free", "log_softmax grad", ""),
        ("malloc", "cast grad", "bf16"), ("free", "slice grad", ""), ("free", "cast grad", ""),
    ),
    "model-loss": (
        ("malloc", "logits", "bf16"), ("malloc", "logits.float", "fp32"), ("malloc", "log_softmax", "fp32"),
        ("free", "logits.float", ""),
        ("malloc", "nll grad", "fp32"), ("malloc", "log_softmax grad", "fp32"),
        ("free", "nll grad", ""), ("free", "log_softmax", ""),
        ("malloc", "cast grad", "bf16"), ("free", "log_softmax grad", ""), ("free", "cast grad", ""),
    ),
}
KEPT = {"model-loss-4.4x": "logits.float", "model-loss": "logits"}


def event_bytes(kind: str, rows: int, tokens: int, vocab: int) -> int:
    """Bytes of one logit-sized tensor: `tokens` is the micro-batch's rows × sequence length."""
    return {"bf16": 2 * tokens * vocab, "fp32": 4 * tokens * vocab,
            "fp32-shifted": 4 * (tokens - rows) * vocab}[kind]


@dataclass(frozen=True)
class LossBlocks:
    allocated: int      # the most the loss's tensors hold at once (the allocator's blocks)
    reserved: int       # the segments they made, from an empty cache
    kept: int           # what the model's output still holds after the backward

    @property
    def stranded(self) -> int:
        """Reserved beyond the loss's own allocated peak: freed blocks no later request of the loss fitted."""
        return self.reserved - self.allocated


def loss_blocks(loss: str, rows: int, tokens: int, vocab: int) -> LossBlocks:
    """Replay the loss's logit-sized tensors (LOSS_EVENTS[loss]) through the default caching allocator."""
    alloc = CachingAllocator()
    handles: dict[str, int] = {}
    sizes: dict[str, int] = {}
    for event, name, kind in LOSS_EVENTS[loss]:
        if event == "malloc":
            sizes[name] = event_bytes(kind, rows, tokens, vocab)
            handles[name] = alloc.malloc(sizes[name])
        else:
            alloc.free(handles.pop(name))
    st = alloc.stats
    return LossBlocks(allocated=st.peak_allocated_bytes, reserved=st.reserved_bytes, kept=sizes[KEPT[loss]])

"""The loop-adjusted estimate of a published row: what the source's loop holds that TRL 1.16's does not, sized from
the loop's code and put into the estimate's own step (a published source declares it as `source: loss:`).

One difference is modelled: the loss over the full logits. TRL 1.16's SFTTrainer takes the loss through its fused LM
head (trl/kernels/chunked_logprob.py, hpcmem.estimate.loss), which never holds a [tokens, vocab] tensor. A loop that
passes labels to the model (transformers' own loss; TRL before the fused head, Answer.AI's train.py, PEFT's
method-comparison run.py) projects every position onto the vocabulary and takes a float32 cross-entropy over it. The
bytes live at that loss's worst instant (the backward of log_softmax: its saved output, the incoming gradient and
the one it makes, beside the 16-bit logits the model's output keeps), per logit element, counted by
hpcmem.trace.tracker on the code itself (tests/validate/test_published_loop.py measures them again):

    model-loss       14 B   transformers ≥ 4.46 loss/loss_utils.py ForCausalLMLoss: `logits.float()`, then
                            `nn.functional.cross_entropy` (bf16 logits 2 + saved log_softmax 4 + its gradient 4 + the
                            gradient it makes 4)
    model-loss-4.4x  16 B   transformers 4.36–4.45 LlamaForCausalLM.forward: `logits = logits.float()` kept in the
                            output, `shift_logits = logits[..., :-1, :].contiguous()`, CrossEntropyLoss (fp32 logits 4
                            + saved log_softmax 4 + its gradient 4 + the gradient it makes 4)

The adjusted step: the LM head's backward phase with the fused head's transient replaced by the full-logits loss
(`elements × bytes`, elements = the rank's micro-batch tokens × vocab_size: the model projects every position), the
other phases as estimated; reserved and device peaks add the estimate's own allocator and device terms on top.

Two more terms from the loss's blocks (hpcmem.validate.published_loss_blocks):
- stranded: what the loss's logit-sized blocks reserve beyond their own allocated peak under the caching allocator
  (4.4x: the bf16 logits' block, 2 B per element, which none of the loss's later fp32 tensors fits). It sits beside
  the head's backward: reserved takes the head phase with them, FSDP's stream pool beside the largest phase as the
  estimate takes it (hpcmem.estimate.fsdp_units `stream_pool_extra`).
- kept (a source with `keeps_output: true`): the loop holds the model's output until after the optimizer step
  (Answer.AI's train.py: `output = None` after `optimizer.zero_grad()`), so the output's logits (4.4x: fp32, 4 B per
  element) sit in every phase after the head's backward — the layers' backward and the optimizer step.

And one from the loop's start (a row with `reserved_at_reset`): a loop that calls `torch.cuda.reset_peak_memory_stats`
after building the model, with no `empty_cache` between (Answer.AI's train.py: FSDP wrapping, then the reset before
the first step), measures a reserved peak of at least what was reserved then: the model's shards plus the blocks
loading and wrapping left cached on the default stream. Those cached blocks serve the step's default-stream
requests; FSDP's all-gather outputs (its unshard stream) and its reduce-scatter outputs, the sharded gradients (its
post-backward stream, torch/distributed/fsdp/_runtime_utils.py `_get_reduce_scatter_tensors` under
`_post_backward_stream`), come from pools of their own streams, which the caching allocator never shares
(CUDACachingAllocator.cpp `get_free_block`). So reserved ≥ reserved at reset + the most any phase holds gathered +
the sharded gradients — a floor (the default stream's cache taken as fully reusable), not an estimate.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcmem.estimate.breakdown import Component, Estimate, Phase
from hpcmem.estimate.fsdp_units import stream_pool_extra
from hpcmem.estimate.names import BACKWARD, GATHERED, GRADIENTS, HEAD_BACKWARD, OPTIMIZER_STEP, PREFETCHED_UNIT
from hpcmem.estimate.parallel import local_micro_batch
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import micro_batch
from hpcmem.validate.published_loss_blocks import LossBlocks, loss_blocks

# bytes per logit element at the full-logits loss's worst instant (module docstring: counted by the tracker)
LOOP_LOSSES = {
    "model-loss": (14, "transformers loss_utils.ForCausalLMLoss (logits.float(), cross_entropy)"),
    "model-loss-4.4x": (16, "transformers 4.36-4.45 LlamaForCausalLM.forward (fp32 logits kept, shifted copy, "
                            "CrossEntropyLoss)"),
}
HEAD_COMPONENT = "loss / fused LM head"


@dataclass(frozen=True)
class Adjusted:
    allocated: int
    reserved: int
    device: int
    note: str

    def peak(self, kind: str) -> int:
        return {"allocated": self.allocated, "reserved": self.reserved, "device": self.device}[kind]


def full_logits_bytes(job: JobSpec, loss: str) -> tuple[int, int]:
    """(elements, bytes) of the full-logits loss of the rank's micro-batch under `loss` (a LOOP_LOSSES key)."""
    per_element, _ = LOOP_LOSSES[loss]
    mb = local_micro_batch(job, micro_batch(job))
    elements = mb.tokens * job.model.vocab_size
    return elements, elements * per_element


def rank_loss_blocks(job: JobSpec, loss: str) -> LossBlocks:
    """The loss's blocks (published_loss_blocks) at the rank's micro-batch."""
    mb = local_micro_batch(job, micro_batch(job))
    return loss_blocks(loss, mb.rows, mb.tokens, job.model.vocab_size)


def stream_pools(phases: list[Phase] | tuple[Phase, ...]) -> int:
    """FSDP's own streams' pools: the most any phase holds gathered + the most it holds of sharded gradients."""
    def held(names: tuple[str, ...]) -> int:
        return max((sum(c.bytes for c in p.components if c.name in names) for p in phases), default=0)

    return held((GATHERED, PREFETCHED_UNIT)) + held((GRADIENTS,))


def adjusted(job: JobSpec, est: Estimate, loss: str, keeps_output: bool = False,
             reserved_at_reset: int | None = None) -> Adjusted:
    """The estimate with the loop's full-logits loss in place of the fused head at the head's backward, its stranded
    blocks beside it, and (keeps_output) the output's logits in every later phase."""
    elements, loss_bytes = full_logits_bytes(job, loss)
    blocks = rank_loss_blocks(job, loss)
    kept = blocks.kept if keeps_output else 0
    head = next((p for p in est.phases if p.name == HEAD_BACKWARD), None)
    fused = next((c.bytes for c in head.components if c.name == HEAD_COMPONENT), 0) if head else 0
    after = est.phases.index(head) + 1 if head else len(est.phases)
    phases = []
    for i, p in enumerate(est.phases):
        if p is head:
            p = Phase(name=p.name, components=(*(c for c in p.components if c.name != HEAD_COMPONENT),
                                               Component(name="full-logits loss", bytes=loss_bytes)))
        elif kept and i >= after and (p.name.startswith(BACKWARD) or p.name == OPTIMIZER_STEP):
            p = Phase(name=p.name, components=(*p.components, Component(name="output logits kept", bytes=kept)))
        phases.append(p)
    head_bytes = (head.bytes if head else est.peak_allocated_bytes) - fused + loss_bytes
    allocated = max(est.peak_allocated_bytes, head_bytes, *(p.bytes for p in phases))
    # the stranded blocks are reserved beside the head's backward, not allocated; FSDP's all-gather pool sits beside
    # whichever phase peaks now (hpcmem.estimate.fsdp_units)
    beside = [p if p.name != HEAD_BACKWARD or not blocks.stranded else Phase(name=p.name, components=(
        *p.components, Component(name="stranded loss blocks", bytes=blocks.stranded))) for p in phases]
    reserved = (max(allocated, *(p.bytes for p in beside)) + stream_pool_extra(job, beside)
                + est.reserved_extra_bytes - est.reserved_pool_bytes)
    floor = reserved_at_reset + stream_pools(phases) if reserved_at_reset and job.parallel.fsdp else 0
    per_element, code = LOOP_LOSSES[loss]
    note = (f"loss over the full logits ({code}): {elements:,} elements × {per_element} B = "
            f"{loss_bytes / 2**30:.2f} GiB in place of the fused head's {fused / 2**30:.2f} GiB"
            + (f"; {blocks.stranded / 2**30:.2f} GiB of its blocks stranded under the caching allocator"
               if blocks.stranded else "")
            + (f"; the output's logits ({kept / 2**30:.2f} GiB) kept through the backward" if kept else "")
            + (f"; reserved at least {floor / 2**30:.2f} GiB: {reserved_at_reset / 2**30:.2f} GiB reserved at the "
               f"loop's peak reset + {(floor - reserved_at_reset) / 2**30:.2f} GiB of FSDP's stream pools"
               if floor else ""))
    reserved = max(reserved, floor)
    return Adjusted(allocated=allocated, reserved=reserved, device=reserved + est.device_extra_bytes, note=note)

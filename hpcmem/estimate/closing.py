"""What every phase of a step holds whatever the layers are (the model states) and the phases after the layers (the
embeddings' backward, the optimizer step): shared by the derived layer terms (hpcmem.estimate.step) and the learned
ones (hpcmem.estimate.learned)."""

from __future__ import annotations

from hpcmem.estimate.breakdown import Component, Phase
from hpcmem.estimate.lora import LoraLayout, lora_layout
from hpcmem.estimate.names import GRADIENTS, OPTIMIZER_STATES, OPTIMIZER_STEP, OPTIMIZER_TEMPORARIES
from hpcmem.estimate.states import ParamParts, States
from hpcmem.estimate.zero_buckets import backward_bucket_bytes, zero_buckets
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import MicroBatch, Precision
from hpcmem.job.trainers import entry


def resident_components(s: States, lora: LoraLayout) -> list[Component]:
    """Model states held through every phase of the step."""
    out = [Component(name="weights", bytes=s.weights, note=s.notes.get("weights", ""))]
    if s.quant_constants:
        out.append(Component(name="quantization constants", bytes=s.quant_constants))
    if lora.enabled:
        out.append(Component(name="lora adapters", bytes=s.adapters,
                             note=" · ".join(x for x in (
                                 f"{lora.num_params:,} params r={lora.r} on {lora.placement()}",
                                 s.notes.get("adapters", "")) if x)))
    out.append(Component(name=OPTIMIZER_STATES, bytes=s.optimizer, note=s.notes.get("optimizer", "")))
    if s.master:
        out.append(Component(name="fp32 master weights", bytes=s.master, note="DeepSpeed fp32 partition"))
    if s.reduce_bucket:
        out.append(Component(name="reduce bucket", bytes=s.reduce_bucket, note=s.notes.get("reduce bucket", "")))
    if s.grad_buffers and s.notes.get("ddp"):
        out.append(Component(name="gradient buckets", bytes=s.grad_buffers, note=s.notes["ddp"]))
    return out


def backward_components(job: JobSpec) -> list[Component]:
    """What a backward holds beside the resident states and whatever the layers are: ZeRO-1/2's reduce bucket(s)
    (hpcmem.estimate.zero_buckets)."""
    size = backward_bucket_bytes(job)
    if not size:
        return []
    b = zero_buckets(job)
    return [Component(name="reduce buckets", bytes=size,
                      note=f"{2 if b.overlap_comm else 1} × {b.reduce_bucket:,} elements, 16-bit ({b.source})")]


def tied_head_gradient(job: JobSpec, prec: Precision, parts: ParamParts, lora: LoraLayout) -> list[Component]:
    """Full fine-tuning of a tied LM head under gradient accumulation: the head's [V, H] weight gradient (TRL's fused
    head returns it whole) reaches the shared weight's AccumulateGrad only together with the embedding's, at the end
    of backward; until then it waits in autograd's input buffer (torch/csrc/autograd/input_buffer.cpp, one slot per
    input of the node), through every layer's backward. From the second micro-batch on `.grad` holds the earlier
    micro-batches' sum beside it (counted in the gradients). Without accumulation `.grad` is None at that time and the
    gradients component already stands for these bytes. Sharded gradients (ZeRO-2/3, FSDP) as in `_embedding_backward`:
    not added."""
    par = job.parallel
    if (lora.enabled or job.train.gradient_accumulation_steps <= 1 or parts.lm_head != 0
            or entry(job.train.trainer).head != "lm" or (par.deepspeed and par.zero_stage >= 2) or par.fsdp):
        return []
    m = job.model
    return [Component(name="tied head gradient", bytes=m.vocab_size * m.hidden_size * prec.weight,
                      note="waits in autograd's input buffer for the embedding's, beside the accumulated .grad")]


def closing_phases(job: JobSpec, mb: MicroBatch, prec: Precision, parts: ParamParts, s: States,
                   resident: list[Component], opt_transient: int, lora: LoraLayout | None = None) -> list[Phase]:
    """The last instant of backward (embeddings) and the optimizer step: states and gradients only, whatever the
    layers are (shared by the derived and the learned layer terms)."""
    lora = lora if lora is not None else lora_layout(job)
    grads_all = Component(name=GRADIENTS, bytes=s.gradients)
    embed_phase = _embedding_backward(job, mb, prec, parts, resident, grads_all,
                                      not lora.enabled or lora.trains_head, lora)
    step_extra = [Component(name="gradient buffers", bytes=s.grad_buffers, note="fp32 gradient partition")] \
        if s.grad_buffers and not s.notes.get("ddp") else []
    optimizer = Phase(name=OPTIMIZER_STEP, components=(
        *resident, grads_all, *step_extra,
        Component(name=OPTIMIZER_TEMPORARIES, bytes=opt_transient)))
    return [p for p in (optimizer, embed_phase) if p is not None]


def _embedding_backward(job: JobSpec, mb: MicroBatch, prec: Precision, parts: ParamParts, resident: list[Component],
                        grads_all: Component, head_trains: bool, lora: LoraLayout) -> Phase | None:
    """The last instant of backward: every gradient exists and the embedding's arrives. With tied embeddings and an
    LM head, the embedding's fresh [V, H] gradient is summed into the head's, which waits in autograd's input buffer,
    in place (torch/csrc/autograd/input_buffer.cpp `accumulate`: TRL's fused head returns a fresh dense gradient), so
    one more [V, H] is alive, next to the incoming [T, H] gradient; the trace models it (hpcmem/trace/tracker.py
    `accumulation_op`). Without an LM head (Reward) the former rule stays: two [V, H]. Untied, the gradient of the
    embedding output ([T, H], twice) is alive. Sharded gradients (ZeRO-2/3, FSDP) go through reduce buckets instead:
    not added."""
    par = job.parallel
    if (par.deepspeed and par.zero_stage >= 2) or par.fsdp:
        return None
    m = job.model
    if lora.enabled:
        if not lora.trains_embedding:
            return None
        # a trained embed_tokens copy (lora_modules_to_save): its dense [V, H] gradient and the incoming [T, H]
        extra = m.vocab_size * m.hidden_size * prec.weight + mb.tokens * m.hidden_size * prec.residual
        return Phase(name="backward (embeddings)", components=(
            *resident, grads_all, *backward_components(job), Component(name="embedding backward", bytes=extra,
                                            note="the embed_tokens copy's gradient (lora_modules_to_save)")))
    if not head_trains:
        return None
    if parts.lm_head == 0 and entry(job.train.trainer).head == "lm":
        extra = m.vocab_size * m.hidden_size * prec.weight + mb.tokens * m.hidden_size * prec.residual
        note = "tied: embedding gradient, summed into the head's in place, + the incoming [T, H] gradient"
        waiting = tied_head_gradient(job, prec, parts, lora)
        if waiting:     # accumulating: the head's buffered gradient is not the .grad the gradients count
            return Phase(name="backward (embeddings)", components=(
                *resident, grads_all, *backward_components(job), *waiting,
                Component(name="embedding backward", bytes=extra, note=note)))
    elif parts.lm_head == 0:
        extra = 2 * m.vocab_size * m.hidden_size * prec.weight
        note = "tied weights, no LM head: embedding gradient and a copy"
    else:
        extra = 2 * mb.tokens * m.hidden_size * prec.residual
        note = "gradient of the embedding output"
        if job.train.gradient_accumulation_steps > 1:
            # accumulating: .grad exists (counted in the gradients), so the embedding's backward allocates a fresh
            # dense [V, H] gradient next to it (aten/src/ATen/native/Embedding.cpp `embedding_dense_backward`), with
            # the incoming [T, H] gradient alive, and AccumulateGrad adds it in place before freeing it
            # (torch/csrc/autograd/functions/accumulate_grad.h `accumulateGrad`).
            fresh = m.vocab_size * m.hidden_size * prec.weight + mb.tokens * m.hidden_size * prec.residual
            if fresh > extra:
                extra, note = fresh, "accumulating: a fresh [V, H] gradient next to .grad, + the incoming [T, H]"
    return Phase(name="backward (embeddings)", components=(
        *resident, grads_all, *backward_components(job),
        Component(name="embedding backward", bytes=extra, note=note)))

"""One steady-state training step (the second optimizer step: states exist), phase by phase.

Peak ≈ max(P + O + A + T_bwd, P + G + O + T_opt): the backward's peak or the optimizer step's (Rajbhandari et al.
2020, "ZeRO", §3 for the model-state terms P, G, O). Backward runs the layers from last to first: at layer k the
saved activations of layers < k are still alive, the gradients of layers > k already exist, and layer k holds its
(recomputed, under checkpointing) activations plus its gradient temporaries. The worst k is found by evaluating
every layer.
"""

from __future__ import annotations

from hpcmem.errors import SpecError
from hpcmem.estimate import activations as act
from hpcmem.estimate import lora_fp32_compute, lora_variants
from hpcmem.estimate.breakdown import Component, Phase
from hpcmem.estimate.closing import backward_components, closing_phases, resident_components, tied_head_gradient
from hpcmem.estimate.lora import LoraLayout
from hpcmem.estimate.lora import backward_bytes_per_input as lora_backward_bytes_per_input
from hpcmem.estimate.lora import backward_transient as lora_backward_transient
from hpcmem.estimate.loss import LossBytes
from hpcmem.estimate.names import (
    ACTIVATIONS,
    AUTOCAST_CACHE,
    FORWARD,
    GATHERED,
    GRADIENTS,
    HEAD_BACKWARD,
    PREFETCHED_UNIT,
)
from hpcmem.estimate.parallel import SequenceBuffers
from hpcmem.estimate.states import ParamParts, States
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import MicroBatch, Precision

GIB = 1024**3
# fp32 [tokens, H] gradients alive in an RMSNorm's backward (its fp32 upcast, `x * rsqrt(var + eps)`, the mean of
# squares: transformers' *RMSNorm.forward), beside the 16-bit gradient arriving at it: five traced at one peak, four
# chosen on the trace matrix's sandwich-norm cases and random jobs (in sample; estimator/LOG.md)
SANDWICH_NORM_FP32 = 4


def sandwich_norm_fp32(prec: Precision) -> int:
    """SANDWICH_NORM_FP32 over a 16-bit residual stream; five over an fp32 one, as traced (Gemma 3 full fine-tuning
    over fp32 weights, random seed 1 job 480 as SFT on one 32,768-token row: five fp32 [T, H] engine buffers beside
    the gradient arriving at the layer), where the four had leaned on the recompute counting the layer's input twice
    (`fp32_layer_input`)."""
    return SANDWICH_NORM_FP32 + (1 if prec.residual == act.FP32 else 0)
# phase and component names other modules read back (hpcmem.estimate.allocator replays the step from them)
def layer_terms(job: JobSpec, mb: MicroBatch, prec: Precision, parts: ParamParts, lora: LoraLayout) -> list[dict]:
    m = job.model

    def saved(k: int) -> dict:
        return act.layer_saved(m, mb, prec, attn=job.train.attn_implementation, layer=k,
                               layer_params=parts.autocast_cached_per_layer, lora=lora)

    # layers differ only by dense vs MoE MLP and by a sliding window's own mask: compute each kind once (the planner
    # calls this thousands of times)
    attn = job.train.attn_implementation
    kinds: dict[tuple[bool, bool], dict] = {}

    def kind(k: int) -> dict:
        key = (m.is_moe and k >= m.num_dense_layers, act.layer_masked(m, mb, attn, k))
        if key not in kinds:
            kinds[key] = saved(k)
        return kinds[key]

    return [kind(k) for k in range(m.num_hidden_layers)]


def build_phases(job: JobSpec, mb: MicroBatch, prec: Precision, parts: ParamParts, s: States, lora: LoraLayout,
                 loss: LossBytes, opt_transient: int, extra_resident: tuple[Component, ...] = (),
                 seq: SequenceBuffers = SequenceBuffers()) -> tuple[list[Phase], int]:
    """Returns (phases, host bytes of offloaded activations). `seq`: what a context/sequence-parallel attention adds
    per layer (hpcmem.estimate.parallel); `mb` is then the rank's share of the sequence."""
    if job.model.learned is not None:
        if seq.name:
            raise SpecError(f"model {job.model.name} (learned profile): {seq.name} is not learned (a learned "
                            "profile holds one GPU's whole sequence); estimate it without context/sequence "
                            "parallelism")
        from hpcmem.estimate.learned import learned_phases  # deferred: learned models only (the profile types' import)

        return learned_phases(job, mb, prec, parts, s, lora, loss, opt_transient, extra_resident)
    t, m = job.train, job.model
    L = m.num_hidden_layers
    resident = resident_components(s, lora) + list(extra_resident)
    terms = layer_terms(job, mb, prec, parts, lora)
    full = [sum(d.values()) + seq.kept_per_layer for d in terms]
    if not t.gradient_checkpointing:
        kept = full
        mode = "no checkpointing"
    elif t.selective_checkpointing:
        kept = [act.selective_bytes(m, mb, prec, t.attn_implementation)] * L
        mode = "selective checkpointing"
    else:
        kept = [act.checkpoint_bytes(m, mb, prec)] * L
        mode = "full checkpointing"
    rope = 2 * mb.tokens * m.head_dim * prec.residual
    # the final norm keeps its fp32 input, and its normalised output for its weight's gradient unless the weight is
    # frozen (LoRA: the layers' norms' rule, hpcmem.estimate.activations `_norm_saved`)
    final_norm = (4 + (0 if lora.enabled else prec.residual)) * m.hidden_size * mb.tokens
    # the 4-D mask lives while the decoder's forward runs (a local of the model's forward, handed to every layer);
    # only checkpointing keeps it past that, as an input of every layer's recompute
    mask = act.mask_bytes(mb, m, job.train.attn_implementation) if t.gradient_checkpointing else 0
    outside = rope + final_norm + loss.saved + mask
    host = 0
    on_gpu_cap = None                   # activation offloading with checkpointing: at most this many saved bytes stay
    # without checkpointing: what each layer leaves on the GPU (storages saved twice); the forward stash (the last
    # five offloaded tensors) is emptied by the first backward node
    stays: list[int] | None = None
    if t.activation_offloading:
        host = sum(kept)
        mode += " + activation offloading"
        if t.gradient_checkpointing:
            on_gpu_cap = act.offloaded_on_gpu(kept)
        else:
            stays = [act.offload_kept_on_gpu(m, mb, prec, t.attn_implementation, lora, k) for k in range(L)]
            host -= sum(stays)

    def on_gpu(saved: int) -> int:
        return saved if on_gpu_cap is None else min(saved, on_gpu_cap)

    # offloaded under full checkpointing (`act.checkpoint_inputs_offloaded`), a layer's checkpoint inputs are on the
    # host when the backward reaches the layer: the forward stash is emptied after the first backward node
    # (trl/models/activation_offloading.py `unpack_tensor_with_streams`), and each layer's input comes back only when
    # its recompute unpacks it (`get_inputs`), held until the autograd node after that one starts — the layer's own
    # input, and the next layer's through the node that runs the recompute (traced: random seed 1 job 191, Qwen3-MoE,
    # and seed 5 job 26, GLM-4: one [tokens, H] input from `unpack` at a layer's peak, none of the layers below)
    offloaded_inputs = act.checkpoint_inputs_offloaded(t)

    saved_total = (on_gpu(sum(kept)) if stays is None else sum(stays)) + outside
    gathered = [Component(name=GATHERED, bytes=s.gathered)] if s.gathered else []
    accum_grads = s.accumulated
    grads_note = s.notes["accumulated"] if accum_grads else ""
    # torch autocast caches the 16-bit copy only of leaf weights that require grad (cached_cast): the layers' linear
    # weights in full fine-tuning (ParamParts.autocast_cached), only the adapters under LoRA; the cache lives until
    # autocast exits (end of forward)
    cached = lora.num_params if lora.enabled else parts.autocast_cached
    autocast_cache = 2 * cached if prec.autocast and t.gradient_checkpointing else 0
    dora_t = lora_variants.forward_transient(lora, mb.tokens, prec, t.quantized)
    activations = Component(name=ACTIVATIONS, bytes=saved_total,
                            note=f"{mode}: {mb.source}; {L} layers")
    forward = Phase(name=FORWARD, components=(
        *resident, *gathered, activations,
        *([Component(name=GRADIENTS, bytes=accum_grads, note=grads_note)] if accum_grads else []),
        *([Component(name=AUTOCAST_CACHE, bytes=autocast_cache,
                     note="bf16 copies of fp32 weights held until autocast exits")] if autocast_cache else []),
        *([Component(name=seq.name, bytes=seq.forward, note=seq.note)] if seq.forward else []),
        Component(name="loss / fused LM head", bytes=loss.forward_transient, note=loss.note)))
    # DoRA's worst adapted linear runs inside a layer, before the final norm and the loss exist: its own instant
    dora = Component(name="DoRA forward", bytes=dora_t, note="the worst adapted linear's, one at a time")
    head_trains = not lora.enabled or lora.trains_head
    head_grad_bytes = (parts.lm_head or parts.embed) * prec.weight if head_trains else 0
    # a trained input embedding (full fine-tuning, or peft's modules_to_save copy of embed_tokens) gets its gradient
    # in the embeddings' backward, after every layer's: none of it is done while the layers run theirs
    embed_trains = (head_trains and parts.lm_head) or (lora.enabled and lora.trains_embedding and not head_trains)
    layer_grad = (s.gradients - head_grad_bytes - (parts.embed * prec.weight if embed_trains else 0))
    layer_grad = max(layer_grad, 0) // L
    buckets = backward_components(job)
    waiting = tied_head_gradient(job, prec, parts, lora)    # after the head's backward, through the layers'
    late_unit = s.prefetched if s.prefetch_late else 0
    prefetched = [Component(name=PREFETCHED_UNIT, bytes=s.prefetched, note="the next layer, all-gathered ahead")] \
        if s.prefetched and not s.prefetch_late else []
    # offloaded under checkpointing, the head's backward holds none of the stash: the loss's saved tensors (its fp32
    # log-softmax, packed outside the head's no-op context) are the first the backward brings back, and that node's
    # post-hook empties the forward stash (trl/models/activation_offloading.py `unpack_tensor_with_streams`) before
    # the head's matmul backward runs
    head_acts = activations if on_gpu_cap is None else Component(
        name=ACTIVATIONS, bytes=saved_total - on_gpu(sum(kept)), note=activations.note)
    head_phase = Phase(name=HEAD_BACKWARD, components=(
        *resident, *gathered, *buckets, head_acts,
        *([Component(name=GRADIENTS, bytes=accum_grads, note=grads_note)] if accum_grads else []),
        Component(name="loss / fused LM head", bytes=loss.backward_transient,
                  note="fp32 grad accumulators + tile at the head's backward")))
    # per-layer constants of the backward, then the worst layer k found numerically before any Phase is built
    hidden_t, mlp_t, scores_t = act.backward_parts(m, mb, prec, t.attn_implementation)
    # the recompute runs DoRA's forward again, before the layer's backward frees anything: its weight-norm
    # temporaries (peft/tuners/lora/dora.py DoraLinearLayer.forward) sit on the recomputed layer and the gradient
    # arriving at the layer (traced: the peak of a short-row DoRA job is in get_weight_norm of the recompute); on a
    # dense gated MLP each adapted linear's forward and backward sit beside what exists at its place in the order
    ordered = _ordered_dora(job, mb, prec, lora, terms[0]["mlp"])
    recompute_dora_t, recompute_in_order = 0, False
    if t.gradient_checkpointing:
        in_order = _recompute_dora(lora, mb, prec, t.quantized, m.hidden_size, ordered)
        recompute_dora_t = dora_t if in_order is None else in_order
        recompute_in_order = in_order is not None
    # fp32 adapters computing in fp32 (no autocast): their input copies and down_proj's product sit on the recompute,
    # and down_proj's LoRA backward runs before the product's gradients (hpcmem.estimate.lora_fp32_compute)
    fp32_adapters = lora_fp32_compute.applies(lora, prec, m)
    plain_mlp = not recompute_dora_t and lora_fp32_compute.plain_mlp_lora(lora, m)
    if t.gradient_checkpointing and (fp32_adapters or plain_mlp):
        # under autocast too the recompute meets each adapted MLP linear's forward instant (peft's input copy,
        # lora_B's and the sum's outputs; traced: ViP-LLaVA DPO LoRA all-linear, the recompute's down_proj)
        recompute_dora_t = lora_fp32_compute.recompute_transient(lora, mb.tokens, prec, m)
    lora_mlp_saved = lora.saved_per_layer(mb.tokens, prec, "mlp")
    # an fp32 residual stream: the input norm's fp32 "upcast" is the layer's input itself (`Tensor.to` to its own
    # dtype returns it), which the recompute's layer counts among its saved terms and the checkpoint already holds
    # (traced: a GLM-4 distillation job over fp32 weights, random seed 1 job 474: no norm upcast in the recomputed
    # layer)
    fp32_layer_input = mb.tokens * m.hidden_size * act.FP32 if prec.residual == act.FP32 else 0
    # LoRA on a dense gated MLP whose down_proj carries no adapter: its input, the product act(gate)·up, is no saved
    # term, so none is freed before the product's backward (`own_layer`)
    frozen_product = mb.tokens * m.intermediate_size * prec.act if (
        lora.enabled and m.gated_mlp and not m.is_moe and not lora_fp32_compute.down_proj_adapted(lora)) else 0
    # a wrapped expert stack's weight gradient comes at another instant than the [tokens, I] gradients (traced)
    mlp_side = max(_mlp_backward(lora, mb, prec, mlp_t, ordered), lora_variants.wrapped_weight_gradient(lora, prec))
    routing = act.routing_weight_backward(m, mb, prec)      # the MoE backward's first instant: no weight gradient yet
    if fp32_adapters and lora_fp32_compute.down_proj_adapted(lora):
        mlp_side = lora_fp32_compute.gated_mlp_backward(
            lora, mb.tokens, prec, inter_tensor=mb.tokens * m.intermediate_size * prec.act, mlp_grads=mlp_t,
            kept={mod.leaf: lora.module_saved(mod, mb.tokens, prec) for mod in lora.modules("mlp")})
    lora_attention_t = lora_backward_transient(lora, mb.tokens, prec, "attention")
    # eager attention's score gradients are freed (the softmax's and the two matmuls' backward) before q/k/v's
    # projections and their adapters run their backward on [tokens, q + 2·kv] gradients; SDPA's dq/dk/dv are
    # those gradients (traced: PaliGemma 2 at 4,608 tokens, Gemma 2's eager layer)
    projections = mb.tokens * prec.act * m.head_dim * (m.num_attention_heads + 2 * m.num_key_value_heads)
    if act.effective_attention(m, t.attn_implementation) == "eager":
        attention_side = max(scores_t, projections + lora_attention_t)
    else:
        attention_side = scores_t + lora_attention_t
    # inputs kept for the recompute
    held = rope + mask
    # under selective checkpointing the recompute does not run the attention op again: torch's
    # _CachedTorchDispatchMode (torch/utils/checkpoint.py) hands back the MUST_SAVE outputs already counted in `kept`
    sac_cached = act.sac_saved_attention(m, mb, prec, t.attn_implementation) \
        if t.gradient_checkpointing and t.selective_checkpointing else 0
    prefix = [0]
    for v in kept:
        prefix.append(prefix[-1] + v)
    stays_below = [0]               # offloading without checkpointing: what the layers below k left on the GPU
    for v in stays or ():
        stays_below.append(stays_below[-1] + v)
    # The gated MLP's backward peaks in the product's backward (torch autograd, MulBackward0): down_proj has made the
    # product's gradient and its own weight gradient, the product's two gradients are being written, the saved
    # product is released, and the only [T, H] gradient alive is the one arriving at the layer; gate_proj's and
    # up_proj's weight gradients (and the attention's) do not exist yet (estimator/LOG.md).
    # Without a known down_proj share (LoRA, MoE, plain MLP) the whole layer's gradient stays counted. Under gradient
    # accumulation down_proj's new weight gradient has been added into its .grad and freed by then (AccumulateGrad, as
    # in the MoE layers below; the trace matrix's accumulation cases, estimator/LOG.md).
    down_grad = None
    if not lora.enabled and not m.is_moe and m.gated_mlp and parts.per_layer:
        down_grad = 0 if accum_grads else layer_grad * (m.hidden_size * m.intermediate_size) // parts.per_layer

    post_norm = act.post_mlp_norm_saved(m, mb, prec, lora.enabled)
    if t.activation_offloading and not t.gradient_checkpointing:
        post_norm = 0       # offloaded saved tensors free host memory, not the GPU's

    # Under gradient accumulation a weight's new gradient is added into its .grad by AccumulateGrad as soon as it is
    # made, and freed (torch/csrc/autograd/functions/accumulate_grad.h `accumulateGrad`: in place when .grad exists):
    # in an MoE layer only the weight gradient being written is alive. The MLP's backward writes the down stack's
    # first, with every saved tensor of the layer alive, and the larger gate/up stack's after the activation's saved
    # tensors are freed (`moe_late_written`); the attention's backward writes a projection's (traced on Mixtral:
    # estimator/LOG.md)
    moe_mlp_written, moe_attention_written = (
        (min(layer_grad, (parts.moe_down_stack or parts.largest_moe_tensor) * prec.weight),
         min(layer_grad, parts.largest_attention_tensor * prec.weight)) if accum_grads else (layer_grad, layer_grad))
    moe_late_written = min(layer_grad, parts.largest_moe_tensor * prec.weight) if accum_grads else 0

    def own_layer(d: dict, full_k: int, moe_layer: bool) -> tuple[int, int, int, int]:
        """(recompute, the MLP's worst temporaries, the recompute's, the attention's) of a layer with saved terms `d`:
        the same for every layer of one kind."""
        recompute = full_k - sac_cached - fp32_layer_input if t.gradient_checkpointing else 0
        # by the attention's backward the MLP's saved tensors (and the post-attention norm's) are already freed; they
        # can outweigh the attention's own gradients, so they come off the instant as a whole, floored at zero
        # (traced: a one-layer checkpointed Llama whose weights outweigh its tokens)
        freed = d["mlp"] + d["norms"] // 2 + lora_mlp_saved
        mlp_instant = hidden_t // 2 + mlp_side + down_grad if down_grad is not None else \
            hidden_t + mlp_side + (moe_mlp_written if moe_layer else layer_grad)
        if frozen_product and not moe_layer:
            # a frozen down_proj without an adapter keeps nothing of the product for its backward: the product's
            # backward (MulBackward0) writes its two [tokens, I] gradients beside the one down_proj returned and the
            # saved product's inputs, with nothing of the MLP freed yet, and the gradient arriving at the layer is
            # the only [tokens, H] one (traced: Llama-3.2-1B LoRA q/v SFT at 16k tokens, three [T, I] engine
            # buffers at the last layer's peak)
            mlp_instant = hidden_t // 2 + mlp_side + frozen_product + layer_grad
        mlp_instant = max(mlp_instant, hidden_t + routing) - post_norm
        if moe_layer and moe_late_written:
            mlp_instant = max(mlp_instant, hidden_t + mlp_side + moe_late_written - d["mlp"] - post_norm)
        if m.norms_per_layer == 4:
            # a sandwich norm after the MLP (Gemma 2/3, GLM-4) runs its backward first, with every saved tensor of
            # the layer (its own included) still alive
            mlp_instant = max(mlp_instant,
                              hidden_t // 2 + sandwich_norm_fp32(prec) * act.FP32 * m.hidden_size * mb.tokens)
        attention_instant = max(hidden_t + attention_side - freed
                                + (moe_attention_written if moe_layer else layer_grad), 0)
        recompute_instant = hidden_t // 2 + recompute_dora_t
        if stays is not None:
            # offloaded without checkpointing, a saved tensor comes back when its autograd node runs and goes with
            # the node after it: the MLP's come back for the MLP's backward, the attention's (and the input norm's
            # beyond its fp32 upcast, which stayed) for the attention's, one part at a time — less the q/k norms'
            # fp32 upcasts, which stayed on the GPU too (`act.offload_kept_on_gpu`, counted with the layer's stays)
            qk_stayed = act.FP32 * m.head_dim * (m.num_attention_heads + m.num_key_value_heads) * mb.tokens \
                if m.qk_norm else 0
            # the attention's saved tensors come back for SDPA's backward and go with it; the q/k/v adapters' come
            # back for the projections' backward, where dq, dk and dv (not SDPA's own workspace) are what is left of
            # its gradients
            mlp_instant += d["mlp"] + lora_mlp_saved
            attention_instant = hidden_t + layer_grad + max(
                scores_t + d["attention"] - qk_stayed,
                projections + lora_attention_t + d["lora"] - lora_mlp_saved) + \
                max(d["norms"] // 2 - act.FP32 * m.hidden_size * mb.tokens, 0)
        return recompute, mlp_instant, recompute_instant, attention_instant

    # layer_terms hands back one dict per kind of layer (dense, MoE): each kind's own terms are worked out once
    kinds: dict[int, tuple[int, int, int, int]] = {}
    for k in range(L):
        if id(terms[k]) not in kinds:
            kinds[id(terms[k])] = own_layer(terms[k], full[k], m.is_moe and k >= m.num_dense_layers)

    def layer_instant(k: int) -> tuple[int, int, int, int, int]:
        """(activations, recompute, gradients done, the MLP's / recompute's worst temporaries, the attention's)."""
        # offloaded without checkpointing: what the layers up to k left on the GPU (their own parts: `own_layer`)
        if offloaded_inputs:
            below_and_own = kept[k] + held
        else:
            below_and_own = (on_gpu(prefix[k + 1]) if stays is None else stays_below[k + 1]) + held
        recompute, mlp_instant, recompute_instant, attention = kinds[id(terms[k])]
        if offloaded_inputs:
            # the layer above's input, until the recompute's node ends; above the last layer the final norm's
            recompute_instant += kept[k + 1] if k + 1 < len(kept) else \
                act.final_norm_restored(m.model_type, m.hidden_size, mb.tokens, prec.residual)
        done = accum_grads or (head_grad_bytes + layer_grad * (L - 1 - k))
        both = max(seq.forward, seq.backward)
        head = 0
        if k == L - 1 and lora.enabled:
            # with a frozen head the gradient the fused head returns, scattered back over every position (T, not the
            # scored tokens: GRPO/RLOO score only completions), is the gradient arriving at the last layer, which
            # `hidden_t` counts; only what it holds beyond that: its fp32 accumulator is freed once the head's
            # backward returns the cast (traced: a Llama-3.2-1B LoRA SFT at 16k tokens and a GLM-4 distillation job,
            # random seed 2 job 188, hold one [T, H] in the hidden state's dtype from the head through the last
            # layer's backward)
            head = max(loss.backbone_gradient - hidden_t // 2, 0)
        # DoRA's ordered recompute names the gradients alive when it starts (lora_variants
        # `recompute_output_gradients`); the head's are gone by then (traced, estimator/LOG.md)
        recompute_head = 0 if recompute_in_order else head
        other = max(mlp_instant + head, recompute_instant + recompute_head)
        return below_and_own, recompute, done, other + both, attention + head + both

    def worst_instant(k: int) -> int:
        # FSDP with LoRA leaves as units: the previous layer's unit arrives at the attention projections' backward
        # (hpcmem.estimate.fsdp_units), so it sits beside the attention's temporaries only
        below_and_own, recompute, done, other, attention = layer_instant(k)
        return below_and_own + recompute + done + max(other, attention + late_unit)

    # the worst layer: the largest instant, the last layer of equals (the backward meets it first)
    worst_k = max(_segment_ends(kept, terms, prefix, on_gpu_cap), key=worst_instant)
    below_and_own, recompute, done, other, attention = layer_instant(worst_k)
    layer_held = (Component(name=ACTIVATIONS, bytes=below_and_own, note=f"layers ≤ {worst_k}"),
                  *([Component(name="recompute (one layer)", bytes=recompute)] if recompute else []),
                  Component(name=GRADIENTS, bytes=done, note=grads_note or f"layers > {worst_k} done"))
    seq_note = f"incl. {seq.name} {max(seq.forward, seq.backward) / GIB:.2f} GiB" if seq.name else ""
    if late_unit:
        layer_phases = [
            Phase(name=f"backward (layer {worst_k})", components=(
                *resident, *gathered, *buckets, *waiting, *layer_held,
                Component(name="backward temporaries", bytes=other, note=seq_note))),
            Phase(name=f"backward (layer {worst_k}, attention projections)", components=(
                *resident, *gathered, *buckets, *waiting,
                Component(name=PREFETCHED_UNIT, bytes=late_unit, note="the previous layer, fetched here"),
                *layer_held, Component(name="backward temporaries", bytes=attention, note=seq_note)))]
    else:
        layer_phases = [Phase(name=f"backward (layer {worst_k})", components=(
            *resident, *gathered, *buckets, *waiting, *prefetched, *layer_held,
            Component(name="backward temporaries", bytes=max(other, attention), note=seq_note)))]
    with_dora = Phase(name=FORWARD, components=(*forward.components, dora)) if dora_t else forward
    last_layer = _last_layer_forward(job, mb, prec, lora, with_dora, final_norm + loss.saved)
    if dora_t and not last_layer:
        last_layer = [_inside_layer(with_dora, final_norm + loss.saved)]
    phases = [forward, *last_layer,
              head_phase, *layer_phases, *closing_phases(job, mb, prec, parts, s, resident, opt_transient, lora)]
    return phases, host


def _last_layer_forward(job: JobSpec, mb: MicroBatch, prec: Precision, lora: LoraLayout, forward: Phase,
                        after_layers: int) -> list[Phase]:
    """The forward's instant inside the last layer's MLP, for LoRA on a dense gated MLP without checkpointing: every
    layer's saved tensors exist (the last layer's too, down to down_proj's adapter input), the final norm's and the
    loss's not yet (`after_layers`), and the adapted MLP linear's forward temporaries sit beside them — peft's fp32
    copy of its input (peft/tuners/tuners_utils.py `_cast_input_dtype`, to the adapter's dtype), down_proj's input
    (the activation's product, which a frozen down_proj does not keep) and the outputs
    (hpcmem.estimate.lora_fp32_compute `recompute_transient`, the same instant a recompute meets). With many layers the
    backward is higher; with few (a cut, a short model beside a large vision tower) this instant is the step's peak
    (traced: LLaVA-NeXT DPO LoRA without checkpointing, "step 2 / forward / layer 0")."""
    t, m = job.train, job.model
    if t.gradient_checkpointing or not lora.enabled or not m.gated_mlp or m.is_moe or not lora.modules("mlp"):
        return []
    # beyond the recompute's instant (hpcmem.estimate.lora_fp32_compute `recompute_transient`: lora_A's and the
    # sum's instants of peft's forward): the residual stream the MLP's add will read (the attention block's sum)
    transient = lora_fp32_compute.recompute_transient(lora, mb.tokens, prec, m) + \
        mb.tokens * m.hidden_size * prec.residual
    inside = _inside_layer(forward, after_layers)
    return [Phase(name=inside.name, components=(
        *inside.components, Component(name="forward temporaries", bytes=transient,
                                      note="the last layer's adapted MLP linear: its input, peft's copy of it, its "
                                           "outputs; the residual stream")))]


def _inside_layer(forward: Phase, after_layers: int) -> Phase:
    """The forward's instant inside the last layer: `forward` without the loss's transient and without what only
    exists after the layers (`after_layers`: the final norm's and the loss's saved tensors)."""
    out = [Component(name=ACTIVATIONS, bytes=max(c.bytes - after_layers, 0),
                     note=c.note + "; the final norm's and the loss's not yet")
           if c.name == ACTIVATIONS else c for c in forward.components if c.name != "loss / fused LM head"]
    return Phase(name=f"{FORWARD} (last layer)", components=tuple(out))


def _ordered_dora(job: JobSpec, mb: MicroBatch, prec: Precision, lora: LoraLayout, mlp_saved: int) -> dict | None:
    """What DoRA's ordered instants of a dense gated MLP read (hpcmem.estimate.lora_variants `gated_mlp_backward`,
    `gated_mlp_recompute`): one [tokens, I] tensor, the MLP's saved tensors (the layer's "mlp" term: gate's, act's and
    up's outputs under LoRA) and each adapted MLP linear's saved terms; None where they do not apply — no DoRA, an MoE
    or ungated MLP, or saved tensors offloaded to the host (then a module's backward frees nothing on the GPU)."""
    m, t = job.model, job.train
    on_gpu = t.gradient_checkpointing or not t.activation_offloading
    if not (lora.enabled and lora.dora and m.gated_mlp and not m.is_moe and on_gpu):
        return None
    return {"inter_tensor": mb.tokens * m.intermediate_size * prec.act, "mlp_saved": mlp_saved,
            "kept": {mod.leaf: lora.module_saved(mod, mb.tokens, prec) for mod in lora.modules("mlp")}}


def _recompute_dora(lora: LoraLayout, mb: MicroBatch, prec: Precision, quantized: bool, hidden_size: int,
                    ordered: dict | None) -> int | None:
    """DoRA's worst forward instant in the recompute of a dense gated layer (`_ordered_dora`), or None."""
    if ordered is None:
        return None
    return lora_variants.gated_mlp_recompute(lora, mb.tokens, prec, quantized, inter_tensor=ordered["inter_tensor"],
                                             mlp_saved=ordered["mlp_saved"], kept=ordered["kept"],
                                             hidden_tensor=mb.tokens * hidden_size * prec.residual)


def _mlp_backward(lora: LoraLayout, mb: MicroBatch, prec: Precision, mlp_t: int, ordered: dict | None) -> int:
    """The MLP's backward temporaries beyond the layer's saved terms: its gradients and the adapters' worst backward
    at one instant — or, under DoRA on a dense gated MLP (`_ordered_dora`), each adapted linear's DoRA backward at its
    place in the backward order (hpcmem.estimate.lora_variants `gated_mlp_backward`)."""
    mods = lora.modules("mlp") if lora.enabled else ()
    if ordered is not None and mods:
        worst = lora_variants.gated_mlp_backward(
            lora, mods, mb.tokens, lora_backward_bytes_per_input(lora), inter_tensor=ordered["inter_tensor"],
            mlp_grads=mlp_t, kept=ordered["kept"])
        if worst is not None:
            return worst
    return mlp_t + lora_backward_transient(lora, mb.tokens, prec, "mlp")


def _segment_ends(kept: list[int], terms: list[dict], prefix: list[int], cap: int | None) -> list[int]:
    """The layers at which the worst backward instant can lie, last first. Over a run of layers of one kind (the
    same saved terms and kept bytes) every part of `worst_instant` is linear in k — saved activations below grow by
    one layer's, gradients done shrink by one layer's — except where the activation-offloading cap starts to bind and
    at the last layer (its LoRA backbone gradient): so the largest value, and the last layer that reaches it, is at
    an end of a linear piece. The planner estimates thousands of jobs; this looks at a handful of layers, not all."""
    L = len(kept)
    ends = {0, L - 1, max(L - 2, 0)}
    for k in range(1, L):
        if kept[k] != kept[k - 1] or terms[k] is not terms[k - 1]:
            ends.update((k - 1, k))
    if cap is not None:
        c = next((k for k in range(L) if prefix[k + 1] >= cap), None)     # the first layer whose saved bytes are capped
        if c is not None:
            ends.update(k for k in (c - 1, c) if 0 <= k < L)
    return sorted(ends, reverse=True)

"""What DPO, GRPO and RLOO add to a step: a reference model, no-grad passes, generation, vLLM, weight sync.

Rules (trl 1.16, checked against the installed source):
- Reference model (dpo_trainer.py, grpo_trainer.py, rloo_trainer.py): a second full model from the policy's
  `model_init_kwargs` (fp32 unless dtype), absent with PEFT (adapters disabled act as reference), with
  `precompute_ref_log_probs` (DPO) or `beta == 0` (GRPO default). `prepare_deepspeed` (trl/models/utils.py) runs it at
  ZeRO stage 0 unless the policy uses ZeRO-3: a FULL 16-bit replica per GPU under ZeRO-1/2, a /N partition under ZeRO-3.
- No-grad passes (reference forward, old log-probs — see `computes_old_logps`): one layer's intermediates at a time,
  plus the fused head's tile; chunked by per_device_train_batch_size.
- Generation (HF `generate`, no vLLM): KV cache 2 · layers · kv_heads · head_dim · tokens · rows · bytes for all
  generation rows of the rank at once (per_device_train_batch_size × steps_per_generation), at two instants — the
  prefill and the last token (`generation_instants`); with ZeRO-3 and `ds3_gather_for_generation` the whole model is
  gathered on every GPU.
- vLLM colocate reserves `vllm_gpu_memory_utilization` × device memory per rank at start (outside PyTorch's allocator);
  `vllm_enable_sleep_mode` releases it while training (level 2), so the peak becomes max(train, resident + pool).
  Server mode puts nothing on the training GPUs.
- Weight sync to vLLM: PEFT + ZeRO-3 gathers the whole model (merge of adapters); otherwise one layer at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcmem.estimate.activations import eager_scores_no_grad, expert_bytes, own_pass_mask_bytes
from hpcmem.estimate.breakdown import Component, Phase
from hpcmem.estimate.learned import no_grad_entry, no_grad_layer_peak
from hpcmem.estimate.loss import logits_tile
from hpcmem.estimate.lora import LoraLayout, lora_layout
from hpcmem.estimate.names import ACTIVATIONS, FORWARD, GRADIENTS, HEAD_BACKWARD, is_forward
from hpcmem.estimate.states import FP32_HEAD_TYPES, ParamParts
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.generation_batch import generation_batch_size
from hpcmem.job.shape import Precision, micro_batch
from hpcmem.job.trainers import entry

FP32 = 4
REFERENCE_FORWARD = "reference forward"
NO_GRAD_PASS = "no-grad pass"      # the reference forward's component (hpcmem.estimate.vision replaces it)
REFERENCE_MASK = "reference pass's mask"    # built by its language model: not there while a vision tower runs


def computes_old_logps(job: JobSpec) -> bool:
    """Does the trainer run the policy's no-grad log-prob pass after generating? RLOO always does
    (rloo_trainer.py `_generate_and_score_completions`); GRPO only when generation and optimisation are misaligned —
    gradient_accumulation_steps not a multiple of steps_per_generation × num_iterations — or for vLLM's importance
    sampling correction (grpo_trainer.py, same method, trl 1.16)."""
    t = job.train
    rule = entry(t.trainer).old_logps
    if rule != "when_misaligned":
        return rule == "always"
    generate_every = (t.steps_per_generation or t.gradient_accumulation_steps) * t.num_iterations
    return t.gradient_accumulation_steps % generate_every != 0 or (t.use_vllm and t.vllm_importance_sampling_correction)


@dataclass(frozen=True, kw_only=True)
class TrainerExtras:
    resident: tuple[Component, ...]       # held through every phase (reference model)
    phases: tuple[Phase, ...]             # extra phases, each with the resident base added by the caller
    vllm_pool: int                        # device-level bytes outside the allocator while training (0: none/asleep)
    vllm_pool_asleep: int                 # pool that sleep mode releases during training
    notes: tuple[str, ...]


def has_reference(job: JobSpec) -> bool:
    t = job.train
    rule = entry(t.trainer).reference
    if t.use_peft or rule == "none":
        return False
    if rule == "unless_precomputed":
        return not t.precompute_ref_log_probs
    return t.beta != 0.0          # when_beta


def adapters_off_reference(job: JobSpec) -> bool:
    """DPO / KTO under PEFT with no reference model: the reference forward still runs, through the policy with its
    adapters disabled (dpo_trainer.py / kto_trainer.py `_compute_loss`: `use_adapter(model, None)`), unless the
    reference log-probs were precomputed."""
    t = job.train
    return t.use_peft and entry(t.trainer).reference == "unless_precomputed" and not t.precompute_ref_log_probs


def with_policy_saved(job: JobSpec, extra: tuple[Phase, ...], phases: list[Phase]) -> tuple[Phase, ...]:
    """The extra phases with the policy's saved activations added to a reference forward that runs after the policy's
    forward and before its backward (DPO, KTO: `_compute_loss`); GRPO/RLOO score before the policy's forward. From
    the second micro-batch of gradient accumulation on, the gradients the earlier micro-batches' backward left in
    `param.grad` are there too (transformers/trainer.py `_run_epoch` zeroes them only after the optimizer step): the
    forward's gradients component, which it has only then."""
    if entry(job.train.trainer).generates:
        return extra
    saved = tuple(c for p in phases if p.name == FORWARD for c in p.components if c.name == ACTIVATIONS)
    if not any(p.name == FORWARD for p in phases):
        # a learned profile's forward that peaks inside a layer ("forward (layer k)", hpcmem.estimate.learned) holds
        # that layer's instant, not what the forward left: what the policy's backward finds at the LM head stands in
        saved = tuple(c for p in phases if p.name == HEAD_BACKWARD for c in p.components if c.name == ACTIVATIONS)
    saved += tuple(c for p in phases if is_forward(p.name) for c in p.components if c.name == GRADIENTS)
    return tuple(Phase(name=p.name, components=(*saved, *p.components)) if p.name == REFERENCE_FORWARD else p
                 for p in extra)


def reference_bytes(job: JobSpec, parts: ParamParts) -> int:
    """The reference (or teacher) model's weights: `create_model_from_path` loads the whole checkpoint, so a
    vision-language model's vision tower and merger too (AutoModelForImageTextToText)."""
    par, t = job.parallel, job.train
    ref_dtype = 2 if par.deepspeed and (t.bf16 or t.fp16) else job.weight_bytes
    tower = job.model.vision.num_params if job.model.vision is not None else 0
    full = (parts.total + tower) * ref_dtype
    if job.model.model_type in FP32_HEAD_TYPES and not par.deepspeed and not t.quantized:
        # the reference loads as the policy does (trl/trainer/dpo_trainer.py `create_model_from_path`): an fp32 head
        # kept whatever the dtype (states.py `FP32_HEAD_TYPES`); DeepSpeed casts every parameter of the engine it wraps
        full += parts.lm_head * (4 - ref_dtype)
    if (par.deepspeed and par.zero_stage == 3) or par.fsdp:
        return full // par.world_size
    return full


def _no_grad_parts(job: JobSpec, rows: int, seq: int, prec: Precision) -> tuple[int, int, int, int]:
    """(hidden state in/out, one layer's widest intermediates, the fused head's tile, 3 fp32 statistics per token) of
    a no-grad forward over rows × seq tokens."""
    m = job.model
    tokens = rows * seq
    # a learned pass's model-level tensors (position biases, float masks) ride with the hidden states throughout
    hidden = 2 * tokens * m.hidden_size * max(prec.residual, prec.act) + no_grad_entry(job, rows, seq, prec)
    traced = no_grad_layer_peak(job, rows, seq, prec)
    if traced is not None:      # a learned model: its traced layer instant (output included) instead of the formulas
        mlp = max(traced - tokens * m.hidden_size * prec.act, 0)
    else:                       # the MLP's intermediates, or an eager attention's softmax instant (Gemma 2) if wider
        mlp = max(routed_experts_no_grad(job, tokens, expert_bytes(prec)) if m.is_moe
                  else 3 * tokens * m.intermediate_size * prec.act,
                  eager_scores_no_grad(m, rows, seq, prec.act, job.train.attn_implementation))
    tile = min(tokens, 4096) * min(m.vocab_size, 32768) * prec.act
    return hidden, mlp, tile, tokens * 3 * FP32


def routed_experts_no_grad(job: JobSpec, tokens: int, act: int) -> int:
    """The widest instant of an MoE layer's routed experts without autograd, over `tokens` tokens routed to k experts
    each (S = tokens·k rows; transformers/integrations/moe.py `grouped_mm_experts_forward`). Its locals live until it
    returns: the routed copy of the hidden states [S, H] (`selected_hidden_states_g`) throughout; at the gate
    (`_default_apply_gate`) gate_up_proj's output [S, 2I], act(gate) and the product [S, I] each; at the end the
    experts' output `proj_out`, its product with the routing weights and that product's copy in token order
    (`weighted_out[inv_perm]`), [S, H] each: max(H + 4I, 4H) per routed row."""
    m = job.model
    routed = tokens * m.num_experts_per_tok
    return routed * max(m.hidden_size + 4 * m.moe_intermediate_size, 4 * m.hidden_size) * act


def no_grad_pass(job: JobSpec, rows: int, seq: int, prec: Precision) -> int:
    """Live bytes of a no-grad forward: hidden state in/out, one layer's widest intermediates, the fused head tile."""
    hidden, mlp, tile, stats = _no_grad_parts(job, rows, seq, prec)
    return hidden + mlp + tile + stats


def reference_pass(job: JobSpec, rows: int, seq: int, prec: Precision, scored: int) -> int:
    """Live bytes of DPO's / KTO's reference forward beside the policy's saved activations: `no_grad_pass` with the
    widest layer's intermediates and the fused head's tile apart, as they run (the head after the last layer). The
    reference forward gets the policy's labels, and TRL's fused head projects only the `scored` positions whose
    next-token label is not -100 (trl/trainer/utils.py `add_fused_lm_head`): the prompt's (a vision prompt's image
    tokens) are not tiled."""
    hidden, mlp, _, stats = _no_grad_parts(job, rows, seq, prec)
    return hidden + max(mlp, logits_tile(scored, job.model.vocab_size, prec.act)) + stats


def scoring_pass(job: JobSpec, prec: Precision) -> int:
    """Live bytes of a generating trainer's no-grad scoring pass (old log-probs, the reference's): TRL's
    `_get_per_token_logps_and_entropies` (trl/trainer/grpo_trainer.py, rloo_trainer.py) runs the model over chunks of
    per_device_train_batch_size rows of prompt + completion with the prompt's labels set to -100, so the fused head
    projects the completion positions only, after the last layer (`reference_pass`)."""
    t = job.train
    rows = t.per_device_train_batch_size
    return reference_pass(job, rows, t.max_prompt_length + t.max_completion_length, prec,
                          rows * t.max_completion_length)


def kv_cache_bytes(job: JobSpec, rows: int, tokens_per_row: int, dtype_bytes: int) -> int:
    m = job.model
    return 2 * m.num_hidden_layers * m.num_key_value_heads * m.head_dim * tokens_per_row * rows * dtype_bytes


GENERATION_INSTANTS = ("generation (prefill)", "generation (last token)")


def is_generation_phase(name: str) -> bool:
    """Whether a phase of the estimate is one of `generation_instants` (with or without `generation_phases`'s
    prefix)."""
    return name.endswith(GENERATION_INSTANTS)


def generation_instants(job: JobSpec, rows: int, act: int) -> list[tuple[str, tuple[Component, ...]]]:
    """The two peaks of transformers' `generate` (generation/utils.py `_sample`, no_grad, outside autocast: tensors in
    the weights' dtype `act`), each row running to max_completion_length:
    - end of the prefill (last layer's MLP): the KV cache of the prompts, and per prompt token the embeddings (kept by
      the model's forward), the layer's input (kept by the caller's loop), its residual and normalised hidden, three
      [T, intermediate] MLP tensors (act(gate), up, their product) and RoPE's fp32 cos/sin;
    - the last token: the whole KV cache, plus one layer's keys (DynamicCache's `torch.cat` builds the longer tensor
      before the old one is freed), plus the last position's logits, their fp32 copy and the softmax (rows × vocab).
    Checked against the trace with `run_trace(..., generation=True)` (tests/trace/test_trace_grpo.py)."""
    m, t = job.model, job.train
    prompt, total = t.max_prompt_length, t.max_prompt_length + t.max_completion_length
    tokens = rows * prompt
    inter = m.moe_intermediate_size * m.num_experts_per_tok if m.is_moe else m.intermediate_size
    prefill_act = tokens * (4 * m.hidden_size + 3 * inter) * act + 2 * tokens * m.head_dim * FP32
    adapters = tokens * uncast_adapter_bytes_per_token(lora_layout(job), inter, act) if not m.is_moe else 0
    kv_all = kv_cache_bytes(job, rows, total, act)
    return [
        (GENERATION_INSTANTS[0], (
            Component(name="KV cache", bytes=kv_cache_bytes(job, rows, prompt, act),
                      note=f"{rows} rows × {prompt} prompt tokens"),
            Component(name="prefill activations", bytes=prefill_act, note="last layer, no grad"),
            *((Component(name="fp32 adapters on 16-bit weights", bytes=adapters,
                         note="MLP adapters outside autocast (peft casts the input up)"),) if adapters else ()))),
        (GENERATION_INSTANTS[1], (
            Component(name="KV cache", bytes=kv_all, note=f"{rows} rows × {total} tokens, HF generate"),
            Component(name="cache growth", bytes=kv_all // (2 * m.num_hidden_layers),
                      note="one layer's keys twice during torch.cat"),
            Component(name="generation logits", bytes=rows * m.vocab_size * (act + 2 * FP32)))),
    ]


def uncast_adapter_bytes_per_token(lora: LoraLayout, inter: int, act: int) -> int:
    """What fp32 adapters on `act`-byte weights add per prompt token to the prefill's MLP instant. `generate` runs
    outside autocast, so peft's Linear.forward (peft/tuners/lora/layer.py) casts the module's input to the adapter
    dtype (a 4 B copy), and the model is in training mode, so lora_dropout makes a 4 B output and a 1 B mask of that
    copy (9 B per input element at once); after lora_A, lora_B's fp32 output and its product with `scaling` live
    beside the copy (4·in + 8·out B). Beside them: the base output (act · out) and the MLP's earlier [T, inter]
    tensors — act(gate) for up_proj, the product for down_proj (modeling_llama.py LlamaMLP.forward). The instant
    already counts three act-byte [T, inter] tensors; this is the excess of the worst adapted MLP linear over them.
    Traced: tests/trace/test_trace_grpo.py. Dense MLPs only (an MoE layer's experts run per routed token)."""
    if not lora.enabled or lora.adapter_bytes <= act:
        return 0
    mask = 1 if lora.dropout else 0
    worst = 0
    for mod in lora.modules("mlp"):
        own = max((2 * FP32 + mask) * mod.in_features if mask else 0, FP32 * mod.in_features + 2 * FP32 * mod.out_features)
        earlier = act * inter if mod.leaf in ("up_proj", "down_proj") else 0
        worst = max(worst, own + act * mod.out_features + earlier)
    return max(0, worst - 3 * act * inter)


def generation_phases(job: JobSpec, parts: ParamParts, prec: Precision, rows: int, prefix: str = "") -> list[Phase]:
    """transformers' `generate` of `rows` completions (no vLLM): its two instants, with the whole model gathered
    under ZeRO-3 when ds3_gather_for_generation (trl/models/utils.py `unwrap_model_for_generation`)."""
    par = job.parallel
    gathered = (Component(name="gathered model (ds3_gather_for_generation)", bytes=parts.total * 2),) \
        if par.deepspeed and par.zero_stage == 3 and job.train.ds3_gather_for_generation else ()
    return [Phase(name=prefix + name, components=(*gathered, *comps))
            for name, comps in generation_instants(job, rows, prec.weight)]


def trainer_extras(job: JobSpec, parts: ParamParts, prec: Precision) -> TrainerExtras:
    """The generic extras (reference model, its forward, generation, vLLM), joined with what the trainer's own
    registry hook `estimate` adds (a TrainerExtras of its own)."""
    extras = _generic_extras(job, parts, prec)
    hook = entry(job.train.trainer).hook("estimate")
    if hook is None:
        return extras
    own = hook(job, parts, prec)
    return TrainerExtras(resident=extras.resident + own.resident, phases=extras.phases + own.phases,
                         vllm_pool=extras.vllm_pool + own.vllm_pool,
                         vllm_pool_asleep=extras.vllm_pool_asleep + own.vllm_pool_asleep,
                         notes=extras.notes + own.notes)


def _generic_extras(job: JobSpec, parts: ParamParts, prec: Precision) -> TrainerExtras:
    t, par = job.train, job.parallel
    e = entry(t.trainer)
    resident: list[Component] = []
    phases: list[Phase] = []
    notes: list[str] = []
    if has_reference(job):
        where = "partition" if (par.deepspeed and par.zero_stage == 3) or par.fsdp else "full replica per GPU"
        resident.append(Component(name="reference model", bytes=reference_bytes(job, parts), note=where))
    b = t.per_device_train_batch_size
    if not e.generates and (has_reference(job) or adapters_off_reference(job)):
        # the rows of the training micro-batch (a length profile's, or max_length's, rounded as the collator pads)
        mb = micro_batch(job)
        rows = e.rows_per_example * b
        what = "the policy, adapters disabled" if adapters_off_reference(job) else "the reference model"
        # the pass builds its own 4-D mask for padded rows (masking_utils `create_causal_mask`, alive through it);
        # the policy's is gone by then without checkpointing and kept for the recompute with it (hpcmem.estimate.step
        # counts that one). Eager attention builds float masks instead, counted in its scores' instant.
        own_mask = own_pass_mask_bytes(mb, job.model, t.attn_implementation)
        phases.append(Phase(name=REFERENCE_FORWARD, components=(
            Component(name=NO_GRAD_PASS, bytes=reference_pass(job, rows, mb.seq, prec, mb.label_tokens),
                      note=f"chosen+rejected through {what}" if rows > b else what),
            *([Component(name=REFERENCE_MASK, bytes=own_mask, note="[rows, 1, seq, seq] boolean")]
              if own_mask else []))))
    if not e.generates:
        return TrainerExtras(resident=tuple(resident), phases=tuple(phases), vllm_pool=0, vllm_pool_asleep=0,
                             notes=tuple(notes))
    if has_reference(job):
        phases.append(Phase(name=REFERENCE_FORWARD, components=(
            Component(name="no-grad pass", bytes=scoring_pass(job, prec)),)))
    if computes_old_logps(job):
        phases.append(Phase(name="old log-prob pass", components=(
            Component(name="no-grad pass", bytes=scoring_pass(job, prec),
                      note="chunked by per_device_train_batch_size"),)))
    gen_rows = generation_batch_size(job) // par.world_size
    pool = asleep = 0
    if not t.use_vllm:
        phases += generation_phases(job, parts, prec, gen_rows)
    elif t.vllm_mode == "colocate":
        if job.gpu is None:
            notes.append("vLLM colocate pool needs --gpu (vllm_gpu_memory_utilization × device memory); not counted")
        else:
            # vllm/v1/worker/gpu_worker.py Worker.init_device: requested_memory = MemorySnapshot().total_memory ×
            # gpu_memory_utilization, the total of torch.cuda.mem_get_info() — the GPU's usable capacity
            share = int(t.vllm_gpu_memory_utilization * job.gpu.usable_bytes)
            if t.vllm_enable_sleep_mode:
                asleep = share
            else:
                pool = share
        if par.deepspeed and par.zero_stage == 3:
            sync = parts.total * 2 if t.use_peft else 2 * parts.per_layer
            phases.append(Phase(name="weight sync", components=(
                Component(name="gathered for vLLM sync", bytes=sync,
                          note="PEFT + ZeRO-3 gathers the whole model" if t.use_peft else "one layer at a time"),)))
    else:
        notes.append("vLLM server mode: generation runs on separate GPUs (trl vllm-serve), nothing on these")
    return TrainerExtras(resident=tuple(resident), phases=tuple(phases), vllm_pool=pool, vllm_pool_asleep=asleep,
                         notes=tuple(notes))

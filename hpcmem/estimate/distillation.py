"""What TRL 1.16's DistillationTrainer adds to a generating step: the teacher and the chunked divergence loss.

The step (trl/trainer/distillation_trainer.py): the student generates B × gradient_accumulation_steps completions
(the generic generation phases, hpcmem.estimate.trainers), then per micro-batch runs its backbone (no LM head) with
gradients, the teacher's backbone without (`_compute_loss`, `torch.no_grad`), and `_chunked_divergence_loss`:
both hidden states of the N scored completion positions go through `ChunkedDivergenceFunction`
(trl/kernels/chunked_divergence.py), which projects them onto both LM heads in [4096, 32768] tiles and never holds
either model's [N, V] logits. What the GPU holds, by instant:

- resident: the teacher's weights — a full replica per GPU in its load dtype (16-bit under DeepSpeed, whose
  `prepare_deepspeed` runs it at ZeRO stage 0), a 1/N partition under ZeRO-3 or FSDP (`accelerator.prepare_model`);
- forward, after the student's backbone: the teacher's no-grad pass (one layer's intermediates, its full
  last_hidden_state [B, S, H_t]), then the loss's two fp32 tiles and nine fp32 statistics per position, with the
  teacher's full last hidden state still referenced;
- kept for backward: both compact hidden states [N, H] and [N, H_t] (Triton path: `h[valid]`), and three fp32
  statistics per position;
- backward of the loss: an fp32 grad_hidden [N, H], an fp32 grad_weight [V, H] when the head trains, the two tiles
  and the tile's cast (two casts where a next tile follows), then the gradient scattered back over all T
  positions.
The teacher never sees a gradient, an optimizer state or a generation.
"""

from __future__ import annotations

from dataclasses import replace

from hpcmem.estimate.activations import eager_scores_no_grad, own_pass_mask_bytes
from hpcmem.estimate.breakdown import Component
from hpcmem.estimate.loss import TOKEN_CHUNK_SIZE, VOCAB_CHUNK_SIZE, LossBytes, returned_cast
from hpcmem.estimate.states import ParamParts, param_parts
from hpcmem.estimate.trainers import TrainerExtras, reference_bytes, routed_experts_no_grad
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import MicroBatch, Precision
from hpcmem.job.spec import DTYPES, load_dtype
from hpcmem.models.spec import ModelSpec

FP32 = 4
STATS = 9            # s_max, s_sum, s_x_sum, t_max, t_sum, t_weighted_gap, s_weighted_gap, jsd, kl_student
SAVED_STATS = 3      # s_log_z, t_log_z, aux


def teacher_of(job: JobSpec) -> ModelSpec:
    if job.teacher is None:
        raise ValueError("distillation needs the teacher's ModelSpec (teacher_model_name_or_path)")
    return job.teacher


def teacher_weight_bytes(job: JobSpec) -> int:
    """Bytes per teacher weight as loaded: teacher_model_init_kwargs' dtype, else the student's (TRL's script passes
    ModelConfig's dtype to both)."""
    return DTYPES.get(load_dtype(job.train.teacher_dtype, job.teacher.dtype if job.teacher is not None else None), 2)


def extras(job: JobSpec, parts: ParamParts, prec: Precision) -> TrainerExtras:
    """The teacher's weights, resident through every phase, placed like a reference model."""
    par = job.parallel
    teacher = teacher_of(job)
    as_loaded = replace(job, model=teacher, train=replace(job.train, dtype=job.train.teacher_dtype))
    where = "partition" if (par.deepspeed and par.zero_stage == 3) or par.fsdp else "full replica per GPU"
    return TrainerExtras(resident=(Component(name="teacher model", bytes=reference_bytes(as_loaded,
                                                                                        param_parts(teacher)),
                                             note=f"{teacher.name}, {where}, no gradient"),),
                         phases=(), vllm_pool=0, vllm_pool_asleep=0, notes=())


def teacher_pass(job: JobSpec, mb: MicroBatch, prec: Precision) -> int:
    """The teacher's no-grad backbone pass over the micro-batch: its input and output hidden states, RoPE, and the
    worst of one layer's instants — the gated MLP's widest intermediates, or, on a padded micro-batch, the attention:
    transformers builds the teacher its own 4-D boolean mask (masking_utils `create_causal_mask`, alive through the
    pass) and SDPA turns it into an additive [rows, 1, seq, seq] bias beside q, the rotated k and v repeated to every
    head (integrations/sdpa_attention.py `repeat_kv`: `use_gqa_in_sdpa` is false with a mask) and its output. A
    teacher whose attention runs eager (Gemma 2's soft-capping) builds its scores whatever the padding: its softmax's
    instant (`eager_scores_no_grad`, with its own float masks in place of the boolean one). Its last hidden state
    [B, S, H_t] stays for the loss."""
    t = teacher_of(job)
    act = 2 if prec.act == 2 or teacher_weight_bytes(job) == 2 else 4
    hidden = mb.tokens * t.hidden_size * max(act, teacher_weight_bytes(job))
    # an MoE teacher's routed experts hold [tokens·k, H]-wide locals (`routed_experts_no_grad`), wider than the
    # gated MLP's three [tokens, I] intermediates of a dense one
    mlp = (routed_experts_no_grad(replace(job, model=t), mb.tokens, act) if t.is_moe
           else 3 * mb.tokens * t.intermediate_size * act)
    q, kv = t.num_attention_heads * t.head_dim, t.num_key_value_heads * t.head_dim
    attention = (act * mb.rows * mb.seq * mb.seq
                 + mb.tokens * act * (2 * q + 2 * kv + (2 * q if kv != q else 0))) if mb.masked else 0
    # the teacher builds its own mask of the student's shape, alive through its pass; the student's is gone by now
    # without checkpointing (a local of its forward), and with checkpointing it stays for the recompute, beside it
    # (hpcmem.estimate.step counts the student's then)
    own_mask = own_pass_mask_bytes(mb, t, job.train.attn_implementation)
    attention = eager_scores_no_grad(t, mb.rows, mb.seq, act, job.train.attn_implementation) or attention
    return 3 * hidden + max(mlp, attention) + 2 * mb.tokens * t.head_dim * FP32 + own_mask


def loss(job: JobSpec, mb: MicroBatch, prec: Precision, head_trains: bool) -> LossBytes:
    """`_chunked_divergence_loss` on the CUDA (Triton) path, as the trace maps it (hpcmem.trace.kernels)."""
    m, t = job.model, teacher_of(job)
    n, v = mb.label_tokens, m.vocab_size
    hs, ht = prec.residual, max(prec.act, teacher_weight_bytes(job))
    rows = min(n, TOKEN_CHUNK_SIZE)
    tiles = 2 * rows * min(v, VOCAB_CHUNK_SIZE) * FP32
    weight_cast = min(v, VOCAB_CHUNK_SIZE) * (m.hidden_size + t.hidden_size) * prec.act if prec.weight != prec.act \
        else 0
    chunk_cast = rows * m.hidden_size * prec.act if hs != prec.act else 0
    teacher_hidden = mb.tokens * t.hidden_size * ht       # the teacher's last hidden state, referenced till the end
    saved = n * (m.hidden_size * hs + t.hidden_size * ht) + n * SAVED_STATS * FP32 + mb.tokens
    fwd = max(teacher_pass(job, mb, prec), teacher_hidden + tiles + STATS * n * FP32 + weight_cast + chunk_cast)
    # fp32 accumulators for the hidden states and (when the head trains) the head, cast back at the return
    accumulators = n * m.hidden_size * FP32 + (v * m.hidden_size * FP32 if head_trains else 0)
    returned = returned_cast(n * m.hidden_size, hs) + (returned_cast(v * m.hidden_size, prec.weight) if head_trains
                                                        else 0)
    # the backward names its tile's cast (`grad_tile = s_tile.to(s_dtype)`), so the previous tile's cast is still
    # referenced while the next one is made: two at once wherever there is a next tile — or, at the return, the last
    # tile's cast beside the accumulators' casts. Where the compute dtype is fp32 (`_compute_dtype`: fp32 weights, and
    # this trainer's forward never enters accelerate's autocast) the cast is the tile itself — `Tensor.to` of a tensor
    # already in that dtype returns it — and nothing is made
    grad_tile = rows * min(v, VOCAB_CHUNK_SIZE) * prec.act if prec.act != FP32 else 0
    next_tile = grad_tile if v > VOCAB_CHUNK_SIZE or n > TOKEN_CHUNK_SIZE else 0
    bwd = tiles + grad_tile + weight_cast + chunk_cast + accumulators + max(next_tile, returned)
    note = (f"chunked divergence vs teacher {t.name}: {n} scored tokens, tiles {rows}×{min(v, VOCAB_CHUNK_SIZE)} "
            "fp32 ×2, no [N, V] logits")
    return LossBytes(saved=saved, forward_transient=fwd, backward_transient=bwd, note=note,
                     backbone_gradient=mb.tokens * m.hidden_size * hs)

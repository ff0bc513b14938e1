"""TRL 1.16's fused LM head (trl/trainer/utils.py add_fused_lm_head, trl/kernels/chunked_logprob.py).

SFT, DPO, GRPO and RLOO never materialise [B, S, V] logits. The forward projects the positions whose label ≠ −100
(on CUDA: `hidden_states[mask]`, a copy) in tiles of TOKEN_CHUNK_SIZE tokens × CHUNK_SIZE vocabulary entries into
one reused buffer `mm_buf` in the compute dtype, folding each tile into seven fp32 per-token statistics; it saves
`hidden`, `log_z` and the targets. The backward allocates an fp32 `grad_hidden` [N, H], an fp32 `grad_weight` [V, H]
when the head trains, the same tile buffer, and casts both gradients back to the input's dtype on return
(`grad_weight.to(weight.dtype)`): a copy for 16-bit weights, none for fp32 ones (`fp32_grad_returned`). Its loop
keeps the previous chunk's cast of the weight (and, past 4,096 tokens, of the hidden states) alive while it makes the
next one.
Reward has a 1-output score head instead (no vocabulary logits).
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import MicroBatch, Precision
from hpcmem.job.trainers import entry

TOKEN_CHUNK_SIZE = 4096          # chunked_logprob.py TOKEN_CHUNK_SIZE
VOCAB_CHUNK_SIZE = 32768         # trainer/utils.py _CHUNKED_LOGPROB_CHUNK_SIZE
FORWARD_STATS = 7                # running_max, sum_exp, x_sum_exp, sq_sum_exp, z_sum, max_before_target, target_logit
FP32, INT64 = 4, 8


@dataclass(frozen=True, kw_only=True)
class LossBytes:
    saved: int                   # kept from forward to backward
    forward_transient: int
    backward_transient: int      # fp32 gradient accumulators + tile + casts, at the backward's return
    note: str
    # the gradient the head returns to the backbone, alive through the last layer's backward: grad_hidden in the
    # hidden state's dtype (`returned_cast`; the fp32 accumulator itself for an fp32 hidden state — the accumulator
    # of a 16-bit one is freed once the head's backward returns its cast), spread by the index/slice backward over all
    # T positions of [B, S, H] (GRPO/RLOO score only the completion, T ≫ N; the model's `logits_to_keep` slice hands
    # the head [N, H], whose returned gradient stays beside the [T, H] one: traced, Qwen3-VL RLOO LoRA)
    backbone_gradient: int = 0


def fp32_grad_returned(numel: int, dtype_bytes: int) -> int:
    """Bytes of an fp32 gradient accumulator of `numel` elements and its cast back to an input of `dtype_bytes`."""
    return numel * FP32 + returned_cast(numel, dtype_bytes)


def returned_cast(numel: int, dtype_bytes: int) -> int:
    """Bytes of the cast of an fp32 gradient of `numel` elements back to an input of `dtype_bytes`.

    TRL's backward returns `grad.to(input.dtype)` (chunked_logprob.py _ChunkedLogprobFunction.backward,
    chunked_divergence.py's backward): torch's `Tensor.to` returns the tensor itself when the dtype already matches
    (aten/src/ATen/native/TensorConversions.cpp `to`: `to_will_alias`), so an fp32 input gets no second copy."""
    return numel * dtype_bytes if dtype_bytes != FP32 else 0


def logits_tile(tokens: int, vocab: int, width: int) -> int:
    """Bytes of one logits tile of the fused LM head: at most TOKEN_CHUNK_SIZE scored tokens × VOCAB_CHUNK_SIZE
    vocabulary entries, `width` bytes each."""
    return min(tokens, TOKEN_CHUNK_SIZE) * min(vocab, VOCAB_CHUNK_SIZE) * width


def loss_bytes(job: JobSpec, mb: MicroBatch, prec: Precision, head_trains: bool) -> LossBytes:
    """The loss of the trainer: its registry hook `loss` when it has its own, else the score head or the fused LM
    head below."""
    own = entry(job.train.trainer).hook("loss")
    if own is not None:
        return own(job, mb, prec, head_trains)
    if entry(job.train.trainer).head == "score":
        # score head: [rows, seq, 1] logits; the pooled value per row
        return LossBytes(saved=mb.tokens * prec.act, forward_transient=mb.tokens * FP32, backward_transient=
                         mb.tokens * job.model.hidden_size * prec.residual, note="score head (1 output)")
    return fused_head_bytes(job, mb, prec, head_trains)


def fused_head_bytes(job: JobSpec, mb: MicroBatch, prec: Precision, head_trains: bool) -> LossBytes:
    """TRL's fused LM head and cross-entropy over `mb.label_tokens` scored tokens, whatever the job's trainer."""
    m = job.model
    h, v, n = m.hidden_size, m.vocab_size, mb.label_tokens
    compute = 4 if job.train.cast_lm_head_to_fp32 else prec.act
    hidden_bytes = 4 if job.train.cast_lm_head_to_fp32 else prec.residual
    tile = logits_tile(n, v, compute)
    saved = n * h * hidden_bytes + n * (FP32 + INT64) + mb.tokens * 1          # hidden[mask], log_z, targets, mask
    weight_cast = min(v, VOCAB_CHUNK_SIZE) * h * compute if prec.weight != compute else 0
    chunk_cast = min(n, TOKEN_CHUNK_SIZE) * h * compute if hidden_bytes != compute else 0
    fwd = tile + FORWARD_STATS * n * FP32 + weight_cast + chunk_cast
    grad_weight = fp32_grad_returned(v * h, prec.weight) if head_trains else 0
    # the backward names its casts (`w_chunk = weight[start:end].to(...)`, `hidden_chunk = ...`), so a chunk's cast
    # is still referenced while the next one is made; the forward casts the weight inside the `mm` call
    token_chunks, vocab_chunks = -(-n // TOKEN_CHUNK_SIZE), -(-v // VOCAB_CHUNK_SIZE)
    next_cast = (max(weight_cast, chunk_cast) if token_chunks > 1 else weight_cast if vocab_chunks > 1 else 0)
    bwd = (tile + weight_cast + chunk_cast + next_cast + fp32_grad_returned(n * h, hidden_bytes) + n * FP32
           + grad_weight)
    note = (f"fused LM head: {n} scored tokens, tiles {min(n, TOKEN_CHUNK_SIZE)}×{min(v, VOCAB_CHUNK_SIZE)}, "
            "no [B,S,V] logits")
    return LossBytes(saved=saved, forward_transient=fwd, backward_transient=bwd, note=note,
                     backbone_gradient=(mb.tokens + (n if entry(job.train.trainer).generates and n < mb.tokens
                                                     else 0)) * h * hidden_bytes)

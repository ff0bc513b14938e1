"""Per-rank memory of sequence-split layouts: context parallelism (torch, FSDP2) and sequence parallelism
(DeepSpeed ALST/Ulysses), and HSDP's sharding group (hpcmem.job.mesh says which ranks share what).

- The sequence: every rank holds 1/cp (or 1/sp) of each row. torch's `context_parallel` shards input_ids, labels,
  shift_labels and position_ids along the sequence (transformers trainer.py `_prepare_context_parallel_inputs`,
  torch/distributed/tensor/experimental/_context_parallel/_attention.py `context_parallel` →
  `_context_parallel_buffers`),
  with the head-tail load balancer when the length divides 2·cp (`_create_default_load_balancer`): each rank keeps two
  chunks of S/(2·cp), S/cp tokens in all. DeepSpeed's `UlyssesSPDataLoaderAdapter.refill` cuts each row into sp
  contiguous chunks. Everything outside attention — embeddings, norms, MLP, the fused LM head and its loss — then runs
  on the local tokens, so the single-GPU terms apply to S/cp (S/sp) tokens.
- Attention, CP: `_templated_ring_attention` keeps the local q, k, v, out and logsumexp for backward (what the local
  flash attention keeps), and while it runs it holds the k/v of the other ranks: the all-gather rotater (accelerate's
  default `cp_comm_strategy` allgather) gathers every rank's concatenated k and v once — the full sequence's k/v — the
  all-to-all rotater one neighbour's chunk at a time; `torch.cat` makes the local k/v buffer it sends; `_SDPAMerger`
  merges the per-chunk outputs in fp32 (`convert_to_f32`). Its backward allocates fp32 dq/dk/dv accumulators
  (`_templated_ring_attention_backward`), gathers k/v again and passes dk/dv around in fp32 (all-to-all rotater).
- Attention, SP: `UlyssesSPAttentionHF.forward` re-lays q, k, v from [S/sp tokens × all heads] to [S tokens × heads/sp]
  with an all-to-all (`_combine_local_sequences`), runs the attention kernel, and re-lays the output back
  (`_partition_global_sequence`). What the kernel keeps is the same number of bytes as the local tokens' q, k, v
  (heads/sp × S = heads × S/sp) unless sp exceeds the key/value heads: then each rank's kv head is replicated
  (`kv_replication_factor`) and k, v keep S × head_dim each. While the exchange runs, the caller's q/k/v, the
  contiguous copies made for the all-to-all and its output are alive; the backward exchanges the gradients the same way.
- Evaluation: CP shards eval batches too (trainer.py `prediction_step` enters the same context); accelerate registers
  Ulysses with `disable_in_eval=True` and prepares no sequence adapter for the eval dataloader, so under SP every rank
  evaluates whole rows.
- DeepSpeed's tiled MLP and tiled logits loss (ulysses_sp.py `TiledMLP`, `TiledFusedLogitsLoss`) are not switched on
  by TRL 1.16, accelerate 1.15 or transformers 5.24: not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import MicroBatch, Precision

FP32 = 4


@dataclass(frozen=True, kw_only=True)
class SequenceBuffers:
    """Transient bytes a sequence-split attention adds while one layer runs (0 without CP/SP)."""

    forward: int = 0
    backward: int = 0
    kept_per_layer: int = 0      # extra bytes each layer keeps for backward (SP with replicated kv heads)
    name: str = ""
    note: str = ""


def local_micro_batch(job: JobSpec, mb: MicroBatch, *, evaluation: bool = False) -> MicroBatch:
    """The micro-batch one rank computes: its share of every row under CP / SP (SP leaves evaluation whole)."""
    lay = job.parallel.layout
    shards = lay.cp if evaluation else lay.seq_shards
    if shards == 1:
        return mb
    seq = -(-mb.seq // shards)
    what = f"cp {lay.cp}" if lay.cp > 1 else f"sp {lay.sp}"
    return replace(mb, seq=seq, label_tokens=-(-mb.label_tokens // shards),
                   source=f"{mb.source}; {what}: 1/{shards} of each row, {mb.rows} × {seq} tokens per rank")


def sequence_buffers(job: JobSpec, mb: MicroBatch, prec: Precision) -> SequenceBuffers:
    """Per-layer buffers of CP's ring attention or SP's all-to-all re-layout on the local micro-batch `mb`."""
    lay = job.parallel.layout
    if lay.cp > 1:
        return _ring_buffers(job, mb, prec)
    if lay.sp > 1:
        return _ulysses_buffers(job, mb, prec)
    return SequenceBuffers()


def _ring_buffers(job: JobSpec, mb: MicroBatch, prec: Precision) -> SequenceBuffers:
    """The worst rank of torch's ring, where a step merges a whole local block (load balancing gives rank 0
    half-size steps). Counted from `_templated_ring_attention(_backward)` and held to a CPU run of that code
    (hpcmem.probe.seq_buffers; tests/probe/test_probe_layouts.py):
    forward — the other ranks' k/v (all-gather: every rank's; all-to-all: the chunk received and the one in use),
    `_SDPAMerger`'s fp32 output, the block's output and its fp32 copy, and the merge's two fp32 temporaries, plus
    fp32 logsumexp pieces;
    backward — the other ranks' k/v again, the local k/v it sends, the fp32 dq accumulator, fp32 dk/dv four times over
    (received from the previous rank, the buffer sent on, the one received, the accumulation's copy), and the kernel's
    dq with dk/dv of a half-size block."""
    m, cp = job.model, job.parallel.cp_size
    t, a = mb.tokens, prec.act
    q, kv, heads = m.num_attention_heads * m.head_dim, m.num_key_value_heads * m.head_dim, m.num_attention_heads
    local_kv = 2 * t * kv * a                                    # torch.cat([k.flatten(), v.flatten()])
    allgather = job.parallel.cp_comm_strategy == "allgather"
    others = cp * local_kv if allgather else 2 * local_kv
    forward = others + t * q * (4 * FP32 + a) + 4 * t * heads * FP32
    backward = others + local_kv + t * q * FP32 + 4 * (2 * t * kv * FP32) + t * (q + kv) * a
    how = f"all-gathered k/v of {cp} ranks" if allgather else "one neighbour's k/v chunk"
    return SequenceBuffers(forward=forward, backward=backward, name="context-parallel attention",
                           note=f"ring attention over cp {cp}: {how}, fp32 merge and dq/dk/dv (torch context_parallel)")


def _ulysses_buffers(job: JobSpec, mb: MicroBatch, prec: Precision) -> SequenceBuffers:
    """`UlyssesSPAttentionHF.forward` and its backward on the local micro-batch `mb`, beside what the single-GPU terms
    already count (q, k, v, the attention output and logsumexp kept for backward; dq, dk, dv in backward). Counted from
    DeepSpeed's code and held to a CPU run of it (hpcmem.probe.seq_buffers; tests/probe/test_probe_layouts.py):
    kept — the output re-laid back to the local tokens is o_proj's input, a tensor of its own beside the attention's
    [S, heads/sp] output (one tensor on one GPU), and k, v of a replicated kv head keep S × head_dim each;
    forward — the caller's q, k, v stay alive while their re-laid copies run, and the exchange holds two more copies
    of the largest tensor; backward — the gradients go through the same two copies."""
    m, sp = job.model, job.parallel.sp_size
    t, a = mb.tokens, prec.act
    q, kv = m.num_attention_heads * m.head_dim, m.num_key_value_heads * m.head_dim
    replicate = max(1, sp // m.num_key_value_heads)              # UlyssesSPAttentionHF.kv_replication_factor
    kv_in = kv * replicate                                       # k/v width entering the all-to-all (repeat_interleave)
    kept = t * q * a + 2 * t * (kv_in - kv) * a
    forward = t * (q + 2 * kv_in) * a + 2 * t * q * a
    backward = 2 * t * q * a
    note = f"Ulysses all-to-all over sp {sp}: heads/{sp} × whole sequence in attention (DeepSpeed ulysses_sp)"
    if replicate > 1:
        note += f"; kv heads replicated ×{replicate}"
    return SequenceBuffers(forward=forward, backward=backward, kept_per_layer=kept, name="sequence-parallel all-to-all",
                           note=note)


def layout_note(job: JobSpec) -> str:
    """The layout for the summary line: `FSDP2 over dp_shard 2 × cp 4` (empty without a parallelism config)."""
    lay = job.parallel.layout
    if not lay.active:
        return ""
    if lay.sp > 1:
        return f"{lay.label()} (ZeRO over all {lay.world} ranks)"
    if job.parallel.fsdp:
        return f"{lay.label()} (states sharded over {lay.state_shards})"
    return lay.label()


def layout_json(job: JobSpec, mb: MicroBatch) -> dict | None:
    """`--json`'s "layout": the sizes in force, the ranks sharing the states and a rank's tokens (null without a
    parallelism config)."""
    lay = job.parallel.layout
    if not lay.active:
        return None
    return {"dp_replicate_size": lay.dp_replicate, "dp_shard_size": lay.dp_shard, "tp_size": lay.tp,
            "cp_size": lay.cp, "sp_size": lay.sp, "data_parallel_size": lay.data_parallel,
            "state_shards": lay.state_shards, "tokens_per_rank": mb.tokens, "label": lay.label()}

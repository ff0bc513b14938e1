"""The attention of a split sequence, measured alone on CPU ranks: torch's ring attention (context parallelism) and
DeepSpeed's Ulysses all-to-all (sequence parallelism), forward then backward, with every storage counted.

Each rank holds its share of q, k, v ([1, heads, tokens, head_dim], bf16) and runs the library's own code over gloo:
torch's `_templated_ring_attention` / `_templated_ring_attention_backward` around the CPU flash kernel (as
hpcmem.probe.cpu_ring registers it), or `UlyssesSPAttentionHF.forward` + autograd around transformers' sdpa
attention. What is reported is the transient above what the layer keeps anyway: the peak while the attention runs,
counting the storages it allocates (outputs included while alive; its inputs and their views not) — the term
hpcmem.estimate.parallel adds per layer. Each rank writes OUT.json.rank<r>: the ranks differ (the ring's load
balancing gives rank 0 half-size steps). `python -m hpcmem.probe.seq_buffers cp|sp TOKENS HEADS KV_HEADS HEAD_DIM
WORLD OUT.json` under the torchrun variables (RANK, WORLD_SIZE, MASTER_ADDR/PORT).

Each rank measures REPEATS times and keeps the least of each peak. A gloo collective returns to Python when its
future completes, but the worker thread that ran it (ProcessGroupGloo's run loop) drops its reference to the work —
and so to the tensors the work holds, e.g. the contiguous copy Ulysses' backward all-to-all sends — a moment later.
The storage is freed in that thread, so once in a while it is still alive when the next allocation sets the peak
(measured: 1 run in 6 had one more q-sized block, 1 MiB, in Ulysses' backward). That race can only add bytes, and
the least of REPEATS runs is what the library's code itself keeps.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import torch
import torch.distributed as dist

from hpcmem.probe.rank_exit import end_rank

from hpcmem.probe.cpu_ring import BACKWARD, FORWARD
from hpcmem.trace.tracker import StorageTracker

REPEATS = 5


class _Tracker(StorageTracker):
    """Storages born inside the call. Not counted: views of the inputs (their storages were born before), and
    AsyncCollectiveTensor — torch's functional collectives wrap their output in one
    (`_c10d_functional._wrap_tensor_autograd`), a subclass without storage of its own whose reported bytes are the
    wrapped output's, already counted."""

    def __init__(self, inputs: tuple[Any, ...]) -> None:
        super().__init__()
        self.inputs = {t.untyped_storage().data_ptr() for t in inputs}

    def _register(self, t: Any, category: str | None, relabel: bool = False) -> None:
        from torch.distributed._functional_collectives import AsyncCollectiveTensor

        if not isinstance(t, AsyncCollectiveTensor) and t.untyped_storage().data_ptr() not in self.inputs:
            super()._register(t, category, relabel)


def _peak_above(fn: Any, inputs: tuple[Any, ...]) -> tuple[Any, int]:
    """Run fn under a tracker: (its result, peak live bytes of the storages it allocates)."""
    tracker = _Tracker(inputs)
    with tracker:
        out = fn()
    return out, tracker.peak_bytes


def ring(tokens: int, heads: int, kv_heads: int, head_dim: int) -> dict[str, int]:
    from torch.distributed.tensor.experimental._context_parallel import _attention as cp

    group = dist.group.WORLD
    q = torch.randn(1, heads, tokens, head_dim, dtype=torch.bfloat16)
    k = torch.randn(1, kv_heads, tokens, head_dim, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    cp._cp_options.enable_load_balance = True

    def forward() -> Any:
        return cp._templated_ring_attention(group, 2, FORWARD, query=q, key=k, value=v, is_causal=True, dropout_p=0.0)

    (out, lse, *_), fwd_peak = _peak_above(forward, (q, k, v))
    grad = torch.randn_like(out)

    def backward() -> Any:
        return cp._templated_ring_attention_backward(group, 2, BACKWARD, grad_out=grad, grad_out_name="grad_out",
                                                     query=q, key=k, value=v, out=out, logsumexp=lse, is_causal=True,
                                                     dropout_p=0.0)

    _, bwd_peak = _peak_above(backward, (q, k, v, out, lse, grad))
    return {"forward": fwd_peak, "backward": bwd_peak}


def ulysses(tokens: int, heads: int, kv_heads: int, head_dim: int) -> dict[str, int]:
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    world = dist.get_world_size()
    attn = UlyssesSPAttentionHF(sdpa_attention_forward, batch_size=1, attn_head_count=heads, attn_head_size=head_dim,
                                kv_head_count=kv_heads, num_hidden_layers=1, process_group=dist.group.WORLD,
                                seq_length_is_variable=True)
    module = torch.nn.Module()
    module.is_causal, module.training, module.num_key_value_groups = True, True, heads // kv_heads
    q = torch.randn(1, heads, tokens, head_dim, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(1, kv_heads, tokens, head_dim, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(1, kv_heads, tokens, head_dim, dtype=torch.bfloat16, requires_grad=True)
    rank = dist.get_rank()
    positions = torch.arange(rank * tokens, (rank + 1) * tokens).unsqueeze(0)

    def forward() -> Any:
        out, _ = attn(module, q, k, v, None, position_ids=positions, dropout=0.0, scaling=head_dim ** -0.5)
        return out

    out, fwd_peak = _peak_above(forward, (q, k, v, positions))
    grad = torch.randn_like(out)

    def backward() -> Any:
        out.backward(grad)

    _, bwd_peak = _peak_above(backward, (q, k, v, out, grad))
    del world
    return {"forward": fwd_peak, "backward": bwd_peak}


def main(argv: list[str]) -> int:
    kind, tokens, heads, kv_heads, head_dim, world, out_path = argv
    if kind == "sp":
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo")     # Ulysses' all-to-all goes through deepspeed.comm
    else:
        dist.init_process_group("gloo", rank=int(os.environ["RANK"]), world_size=int(world))
    try:
        fn = ring if kind == "cp" else ulysses
        runs = [fn(int(tokens), int(heads), int(kv_heads), int(head_dim)) for _ in range(REPEATS)]
        result = {key: min(r[key] for r in runs) for key in runs[0]}
        dist.barrier()      # every rank done communicating before any tears its group down
    finally:
        dist.destroy_process_group()
    with open(f"{out_path}.rank{os.environ['RANK']}", "w") as f:
        json.dump(result, f)
    print(f"rank {os.environ['RANK']}: results written, process group destroyed", flush=True)
    return 0


if __name__ == "__main__":
    end_rank(main(sys.argv[1:]))

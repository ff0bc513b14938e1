"""torch's context parallelism, run on CPU for the probe.

torch 2.13 routes SDPA under `context_parallel` to its ring attention only for the CUDA kernels (flash, efficient,
cuDNN: torch/distributed/tensor/experimental/_context_parallel/_attention.py `_sdpa_handler`); on CPU, SDPA's
`_scaled_dot_product_flash_attention_for_cpu` has no DTensor rule and the step fails. This module registers the CPU
flash kernel with the same ring — torch's own `_templated_ring_attention` and `_templated_ring_attention_backward`,
called as `_scaled_dot_product_ring_flash_attention(_backward)` calls them — so a CPU probe runs the real load
balancing, k/v rotation (all-gather or all-to-all), fp32 merge and fp32 dq/dk/dv accumulators over gloo. Only the
kernel inside each ring step is the CPU one, which keeps what CUDA flash keeps (output and an fp32 logsumexp).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.experimental._context_parallel import _attention as cp

aten = torch.ops.aten
FORWARD = aten._scaled_dot_product_flash_attention_for_cpu.default
BACKWARD = aten._scaled_dot_product_flash_attention_for_cpu_backward.default
SEQ_DIM = 2          # [batch, heads, sequence, head_dim], as torch's ring functions hardcode it


def _handler(op_call: Any, args: tuple, kwargs: dict) -> Any:
    info = DTensor._op_dispatcher.unwrap_to_op_info(op_call, args, kwargs)
    mesh = info.compute_mesh
    group = mesh.get_group()
    local = list(info.local_args)
    kw = dict(info.local_kwargs)
    if op_call == FORWARD:
        query, key, value, *rest = local
        dropout_p = rest[0] if rest else kw.pop("dropout_p", 0.0)
        is_causal = rest[1] if len(rest) > 1 else kw.pop("is_causal", False)
        out = cp._templated_ring_attention(group, SEQ_DIM, FORWARD, query=query, key=key, value=value,
                                           is_causal=is_causal, dropout_p=dropout_p, **kw)
    else:
        grad_out, query, key, value, out_, lse, dropout_p, is_causal = local[:8]
        out = cp._templated_ring_attention_backward(
            group, SEQ_DIM, BACKWARD, grad_out=grad_out, grad_out_name="grad_out", query=query, key=key, value=value,
            out=out_, logsumexp=lse, is_causal=is_causal, dropout_p=dropout_p, **kw)
    return tuple(DTensor.from_local(t, mesh, [Shard(SEQ_DIM)], run_check=False) for t in out)


def enable() -> None:
    """Register the CPU kernel; `context_parallel` picks the handlers up each time it is entered
    (`_enable_cp_dtensor_dispatcher` merges the module's `custom_ops`)."""
    cp.custom_ops[FORWARD] = _handler
    cp.custom_ops[BACKWARD] = _handler

"""`--kernels cuda` for linear-attention hybrids: what flash-linear-attention's and causal-conv1d's CUDA kernels
allocate and save, in place of transformers' torch fallbacks (which keep every chunk's intermediates).

transformers resolves these functions once, at import (integrations/hub_kernels.py
`use_kernel_func_from_hub_with_fallback`): the installed package's kernel if there is one, else the torch fallback
in the modeling file. A GPU node set up as transformers recommends has both packages; the CPU trace has neither. The
stand-ins below are autograd Functions that allocate, save and free exactly what the kernels' Python wrappers do —
same shapes, dtypes and lifetimes (the Triton/CUDA kernels themselves allocate nothing) — read from:

1. causal-conv1d (github.com/Dao-AILab/causal-conv1d @0d2252d), causal_conv1d/causal_conv1d_interface.py
   `CausalConv1dFn`: forward makes x contiguous unless its length or channel stride is 1, allocates `out` like x
   (cpp_functions.py `causal_conv1d_fwd_function`) and saves x, weight, bias; backward allocates dx like x and fp32
   dweight/dbias (`causal_conv1d_bwd_function`), cast back to the weight dtype on return.
2. flash-linear-attention (github.com/fla-org/flash-linear-attention @bc3b101), fla/ops/gated_delta_rule/chunk.py
   `ChunkGatedDeltaRuleFunction` with chunk size 64: `input_guard` (fla/utils.py) makes every tensor argument
   contiguous for the call; forward L2-normalises q and k (fla/modules/l2norm.py `l2norm_fwd`: output like x, fp32
   rstd per row), takes the chunk-local cumsum of g in fp32 (fla/ops/utils/cumsum.py), builds A [B, T, HV, 64] in k's
   dtype and w, u (chunk_fwd.py `chunk_gated_delta_rule_fwd_intra`, wy_fast.py `recompute_w_u_fwd`), the chunk
   states h [B, NT, HV, K, V] and v_new (fla/ops/common/chunk_delta_h.py `chunk_gated_delta_rule_fwd_h`) and o like v
   (chunk_o.py `chunk_fwd_o`); it saves q, q_rstd, k, k_rstd, v, g, beta, A. Backward (`chunk_gated_delta_rule_bwd`)
   recomputes w, u, h, v_new and adds dv, dh, dq/dk/dw/dg (chunk_o.py `chunk_bwd_dqkwg`: NK = K/128 partial fp32 dg
   on Hopper), dk2/dv/db/dg2 (wy_fast.py `prepare_wy_repr_bwd`), all alive until it returns, then `l2norm_bwd`.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from typing import Any

from hpcmem.models.profile import backbone_config

CHUNK = 64                 # fla's default chunk size for the gated delta rule
HOPPER_TILE = 128          # chunk_bwd_dqkwg: BK = min(next_pow2(K), 128) on Hopper (check_shared_mem('hopper'))
# transformers modeling modules whose module-level kernels the mapping replaces (function name → stand-in)
MODULES = ("qwen3_5", "qwen3_5_moe", "qwen3_next", "qwen4_exp", "olmo_hybrid", "lara_mini", "lfm2", "lfm2_moe",
           "lfm3", "inkling", "inkling2", "inkling2_loop")


def _contiguous(t: Any) -> Any:
    return t.contiguous() if t is not None else None


def _empty(shape: tuple[int, ...], like: Any, dtype: Any = None) -> Any:
    import torch

    return torch.empty(shape, dtype=dtype or like.dtype, device=like.device)


def _conv_function() -> Any:
    import torch

    class CausalConv1dStandIn(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any, weight: Any, bias: Any) -> Any:
            if x.stride(2) != 1 and x.stride(1) != 1:
                x = x.contiguous()
            out = torch.empty_like(x)
            ctx.save_for_backward(x, weight, bias)
            return out

        @staticmethod
        def backward(ctx: Any, dout: Any) -> Any:
            x, weight, bias = ctx.saved_tensors
            if dout.stride(2) != 1 and dout.stride(1) != 1:
                dout = dout.contiguous()
            dx = torch.empty_like(x)
            dweight = torch.zeros_like(weight, dtype=torch.float32).type_as(weight)
            dbias = torch.zeros_like(bias, dtype=torch.float32).type_as(bias) if bias is not None else None
            return dx, dweight, dbias

    return CausalConv1dStandIn


def causal_conv1d_fn(hidden_states: Any, weight: Any, bias: Any = None, activation: Any = None, **_: Any) -> Any:
    """causal_conv1d.causal_conv1d_fn for training (no initial/final states): out [B, C, T] like the input."""
    return _conv_function().apply(hidden_states, weight, bias)


# -- the gated delta rule: the wrappers' allocations, function by function, so locals live as long as fla's ------------
def _l2norm_fwd(x: Any) -> tuple[Any, Any]:
    import torch

    return torch.empty_like(x), _empty(tuple(x.shape[:-1]), x, torch.float32)


def _guarded_inputs(q: Any, k: Any, v: Any, g: Any, beta: Any, l2norm: bool) -> tuple[Any, ...]:
    """fla's `input_guard` contiguous copies of (q, k, v, g, beta) — the caller holds them until its call returns —
    then q and k l2-normed in the kernel (fla/modules/l2norm.py `l2norm_fwd`: y and fp32 rstd) when asked:
    (guarded, qn, q_rstd, kn, k_rstd)."""
    guarded = tuple(_contiguous(x) for x in (q, k, v, g, beta))
    qn, q_rstd, kn, k_rstd = guarded[0], None, guarded[1], None
    if l2norm:
        qn, q_rstd = _l2norm_fwd(guarded[0])
        kn, k_rstd = _l2norm_fwd(guarded[1])
    return guarded, qn, q_rstd, kn, k_rstd


def _fwd(q: Any, k: Any, v: Any, g: Any, beta: Any) -> tuple[Any, Any, Any]:
    """chunk_gated_delta_rule_fwd: returns (g cumsum, o, A); w, u, h, v_new are freed on return."""
    import torch

    b, t, hv, dv = v.shape
    nt = -(-t // CHUNK)
    g = torch.empty_like(g, dtype=torch.float32)                         # chunk_local_cumsum
    a = _empty((b, t, hv, CHUNK), k)                                     # A (fused kkt + solve_tril)
    w, u = _empty((b, t, hv, k.shape[-1]), k), torch.empty_like(v)       # recompute_w_u_fwd
    h, v_new = _empty((b, nt, hv, k.shape[-1], dv), k), torch.empty_like(u)   # chunk_gated_delta_rule_fwd_h
    o = torch.empty_like(v)                                              # chunk_fwd_o
    del w, u, h, v_new
    return g, o, a


def _bwd_dqkwg(q: Any, k: Any, v: Any, g: Any, w: Any) -> tuple[Any, Any, Any, Any]:
    import torch

    b, t, h, dk = k.shape
    hv = v.shape[2]
    nk = -(-dk // HOPPER_TILE)
    dq, dkk = _empty((b, t, hv, dk), q), _empty((b, t, hv, dk), k)
    dg = _empty((nk, *g.shape), g, torch.float32)  # noqa: F841 - alive until the return, as fla keeps it
    dw = torch.empty_like(w)
    if h != hv:
        dq, dkk = _empty((b, t, h, dk), q), _empty((b, t, h, dk), k)    # .view(...).sum(3)
    return dq, dkk, dw, _empty(tuple(g.shape), g, torch.float32)         # dg.sum(0)


def _wy_bwd(k: Any, v: Any, beta: Any, g: Any) -> tuple[Any, Any, Any, Any]:
    import torch

    b, t, h, dk = k.shape
    hv = v.shape[2]
    dk2 = _empty((b, t, hv, dk), k)
    dv, dg, db = torch.empty_like(v), torch.empty_like(g), torch.empty_like(beta)
    if h != hv:
        dk2 = _empty((b, t, h, dk), k)
    return dk2, dv, db, dg


def _bwd(q: Any, k: Any, v: Any, g: Any, beta: Any, do: Any) -> tuple[Any, Any, Any, Any, Any]:
    """chunk_gated_delta_rule_bwd: every intermediate alive until it returns (fla keeps them as locals)."""
    import torch

    b, t, hv, dv_ = v.shape
    nt = -(-t // CHUNK)
    w, u = _empty((b, t, hv, k.shape[-1]), k), torch.empty_like(v)       # recompute_w_u_fwd
    h, v_new = _empty((b, nt, hv, k.shape[-1], dv_), k), torch.empty_like(u)   # chunk_gated_delta_rule_fwd_h
    dv = torch.empty_like(do)                                            # chunk_bwd_dv_local
    dh = _empty((b, nt, hv, k.shape[-1], dv_), q)                        # chunk_gated_delta_rule_bwd_dhu
    dv = torch.empty_like(dv)                                            # its dv2
    dq, dk, dw, dg = _bwd_dqkwg(q, k, v, g, w)
    dk2, dv, db, dg2 = _wy_bwd(k, v, beta, g)
    dg = torch.empty_like(dg)                                            # chunk_local_cumsum(dg, reverse=True)
    del w, u, h, v_new, dh, dw, dk2, dg2
    return dq, dk, dv, db, dg


def _gdn_function() -> Any:
    import torch

    class ChunkGatedDeltaRuleStandIn(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, q: Any, k: Any, v: Any, g: Any, beta: Any, l2norm: bool) -> Any:
            guarded, qn, q_rstd, kn, k_rstd = _guarded_inputs(q, k, v, g, beta, l2norm)
            _, _, cv, cg, cbeta = guarded
            g_cum, o, a = _fwd(qn, kn, cv, cg, cbeta)
            ctx.save_for_backward(qn, q_rstd, kn, k_rstd, cv, g_cum, cbeta, a)
            del guarded
            ctx.l2norm = l2norm
            return o

        @staticmethod
        def backward(ctx: Any, do: Any) -> Any:
            q, _, k, _, v, g, beta, _ = ctx.saved_tensors
            do = do.contiguous()                                                  # input_guard
            dq, dk, dv, db, dg = _bwd(q, k, v, g, beta, do)
            if ctx.l2norm:
                dq, dk = torch.empty_like(dq), torch.empty_like(dk)               # l2norm_bwd
            return dq, dk, dv, dg, db, None

    return ChunkGatedDeltaRuleStandIn


def chunk_gated_delta_rule(query: Any, key: Any, value: Any, g: Any, beta: Any, initial_state: Any = None,
                           output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False,
                           **_: Any) -> tuple[Any, Any]:
    """fla.ops.gated_delta_rule.chunk_gated_delta_rule for training ([B, T, H, K] inputs, no initial state)."""
    if initial_state is not None or output_final_state:
        raise NotImplementedError("the gated delta rule stand-in maps training (no recurrent state)")
    return _gdn_function().apply(query, key, value, g, beta, use_qk_l2norm_in_kernel), None


STAND_INS = {"causal_conv1d_fn": causal_conv1d_fn, "torch_chunk_gated_delta_rule": chunk_gated_delta_rule}


def fallback_refusal(name: str, where: str, kernels: str) -> Any:
    """A torch fallback's replacement under `--kernels cuda`: it fails, so the fallback's memory is never reported as
    the GPU's (`where`: the layer it ran in; `kernels`: what a GPU runs instead)."""
    def fallback(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"hpcmem trace --kernels cuda: transformers' torch fallback {name} ran in {where}; on a GPU "
                           f"with {kernels} the training step runs their kernels (a cached or recurrent path is not "
                           "mapped)")

    return fallback


def hybrid_modules(job: Any, modules: tuple[str, ...] = MODULES) -> list[str]:
    """The modeling modules (of `modules`) the job's model is built from: its type's, and its decoder's."""
    from transformers.models.auto.configuration_auto import model_type_to_module_name

    types = {job.model.model_type}
    if job.model.learned is not None:
        types.add(str(backbone_config(job.model.learned.config).get("model_type", "")))
    return sorted({m for t in types if t and (m := model_type_to_module_name(t)) in modules})


@contextlib.contextmanager
def stand_ins(table: dict[str, dict[str, Any]]) -> Iterator[list[int]]:
    """Replace, in each transformers modeling module named in `table` (module name → {function name: stand-in}), the
    named module-level functions with counting stand-ins while the block runs (only those modules are imported: the
    model build imports them anyway); yields [calls so far]."""
    calls = [0]

    def counted(fn: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            calls[0] += 1
            return fn(*args, **kwargs)

        return call

    patched: list[tuple[Any, str, Any]] = []
    for name, functions in table.items():
        try:
            module = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
        except ImportError:
            continue
        for attr, standin in functions.items():
            if hasattr(module, attr):
                patched.append((module, attr, getattr(module, attr)))
                setattr(module, attr, counted(standin))
    try:
        yield calls
    finally:
        for module, attr, original in reversed(patched):
            setattr(module, attr, original)


@contextlib.contextmanager
def linear_attention_kernels(notes: list[str], job: Any) -> Iterator[None]:
    """Replace the torch fallbacks of the job's hybrid modeling module with the kernels' stand-ins while the block
    runs."""
    with stand_ins({name: STAND_INS for name in hybrid_modules(job)}) as calls:
        yield
    if calls[0]:
        notes.append(f"linear-attention hybrids: causal-conv1d's and flash-linear-attention's kernels stand in for "
                     f"transformers' torch fallbacks in {calls[0]} calls (hpcmem/trace/kernels_linear.py)")

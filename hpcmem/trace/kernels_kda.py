"""`--kernels cuda` for Kimi Delta Attention (Kimi-Linear, Bailing-hybrid): what flash-linear-attention's chunk_kda
allocates and saves, in place of transformers' torch fallback (which keeps every chunk's intermediates).

Which path a GPU takes (transformers 5.24): modeling_kimi_linear.py and modeling_bailing_hybrid.py decorate
`chunk_kimi_delta_attention` with `use_kernel_func_from_hub_with_fallback("chunk_kda", "fla")`, which resolves it once,
at import, to fla.ops.kda.chunk_kda when flash-linear-attention imports (integrations/hub_kernels.py; the internal
path from `_KERNELS_INTERNAL_PATH_MAPPINGS`), and `causal_conv1d_fn` to causal-conv1d's (its stand-in:
hpcmem/trace/kernels_linear.py). `KimiLinearDeltaAttention.forward` (and Bailing-hybrid's, the same code) calls those
module-level names; `use_kernelized_func` on the class only registers them for `kernelize` (use_kernels=True, not
TRL's default), so the module attributes are the patch point, as for Gated DeltaNet. In training (no cache) the layer
calls causal_conv1d_fn, then chunk_kda with g = the forget gate already in log space (computed in torch by
KimiLinearForgetGate / BailingHybridForgetGate: fp32 for Kimi-Linear, cast to the hidden dtype for Bailing-hybrid),
beta = sigmoid(b_proj(x)) and use_qk_l2norm_in_kernel=True, so chunk_kda runs with use_gate_in_kernel,
use_beta_sigmoid_in_kernel, safe_gate and disable_recompute all False. The gated RMSNorm around it is transformers'
torch module (a Hub kernel only under use_kernels=True): nothing to map.

Read from flash-linear-attention (github.com/fla-org/flash-linear-attention @bc3b101), chunk size 64, B rows, T tokens,
H query/key heads, HV value heads (H = HV in both models), K = V = linear_head_dim, NT = ⌈T/64⌉:

- fla/ops/kda/chunk.py `chunk_kda` → `ChunkKDAFunction.forward` under `input_guard` (fla/utils/_decorators.py: every
  tensor argument made contiguous for the call — q, k, v are views of the conv output and are copied): `l2norm_fwd`
  on q and k (fla/modules/l2norm.py: output like x, fp32 rstd per row); chunk_fwd.py `chunk_kda_fwd`:
  `chunk_local_cumsum` of g → fp32 [B, T, HV, K] (fla/ops/utils/cumsum.py, output_dtype float); chunk_intra.py
  `chunk_kda_fwd_intra` → Aqk [B, T, HV, 64] in k's dtype, Akk zeros like it, the fp32 diagonal blocks Akkd
  [B, T, HV, 16] (freed on return), and wy_fast.py `recompute_w_u_fwd` → w, kg [B, T, HV, K] in k's dtype, u like v
  (qg not stored: disable_recompute False); fla/ops/common/chunk_delta_h.py `chunk_gated_delta_rule_fwd_h` → h
  [B, NT, HV, K, V] in kg's dtype, v_new like u; fla/ops/gla/chunk.py `chunk_gla_fwd_o_gk` → o zeros like v_new.
  w, u, kg, v_new and h are dropped (`disable_recompute is False`). Saved: the normed q and k, their rstd, v, the
  cumsum of g, g itself, beta, Aqk, Akk. Returns o (type_as q: no copy when q is bf16).
- `ChunkKDAFunction.backward` → chunk_bwd.py `chunk_kda_bwd`: recomputes w, u, qg, kg (`recompute_w_u_fwd` with
  q given), h and v_new; `chunk_kda_bwd_dAv` → dAqk fp32 [B, T, HV, 64], dv like do; `chunk_gated_delta_rule_bwd_dhu`
  → dh [B, NT, HV, K, V] in qg's dtype and dv2 like dv (the first dv freed on rebinding);
  `chunk_kda_bwd_wy_dqkg_fused` → dq, dk fp32 [B, T, HV, K], dv like v, dg fp32, db fp32 [B, T, HV], dAkk fp32
  like Akk (the TileLang backend's version, used when tilelang is installed, allocates the same); chunk_intra.py
  `chunk_kda_bwd_intra` → dq2, dk2, dg2 fp32 like them, db2 fp32 [NK, B, T, HV] with NK = ⌈K / min(32, K↑2)⌉ and
  its sum (db2 freed on return; the caller's dq, dk, db, dg freed on rebinding); for GVA the sums of dq, dk to H
  heads; the reverse `chunk_local_cumsum` of dg (fp32); every local alive until chunk_kda_bwd returns. Then
  `l2norm_bwd` → dq, dk like the normed q, k (the fp32 ones freed), and dg, db cast to g's and beta's dtypes.

Under `--kernels cuda` the torch fallbacks of these modules never run: the recurrent (cached) paths are replaced by a
refusal, and so is a packed batch (cu_seqlens), which this mapping does not cover.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from hpcmem.trace.kernels_linear import (
    _empty,
    _guarded_inputs,
    causal_conv1d_fn,
    fallback_refusal,
    hybrid_modules,
    stand_ins,
)

CHUNK = 64                 # chunk_kda's default chunk size (transformers passes none)
SUB_CHUNK = 16             # chunk_kda_fwd_intra: BC, the fp32 diagonal blocks Akkd [B, T, HV, 16]
INTRA_BK = 32              # chunk_kda_bwd_intra: BK = min(32, next_power_of_2(K)) → NK partial fp32 db
KDA_MODULES = ("kimi_linear", "bailing_hybrid")
FALLBACKS = ("recurrent_kimi_delta_attention", "causal_conv1d_update")


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _w_u(k: Any, v: Any, hv: int, with_q: bool) -> tuple[Any, Any, Any, Any]:
    """wy_fast.py `recompute_w_u_fwd`: w, u, qg (only with q given), kg."""
    import torch

    b, t, _, dk = k.shape
    w, u = _empty((b, t, hv, dk), k), torch.empty_like(v)
    qg = _empty((b, t, hv, dk), k) if with_q else None
    return w, u, qg, _empty((b, t, hv, dk), k)


def _fwd(q: Any, k: Any, v: Any, g: Any) -> tuple[Any, Any, Any, Any]:
    """chunk_kda_fwd: returns (o, g cumsum, Aqk, Akk); Akkd, w, u, kg, h, v_new are freed on return."""
    import torch

    b, t, hv, dv = v.shape
    nt = _cdiv(t, CHUNK)
    g_cum = torch.empty_like(g, dtype=torch.float32)                         # chunk_local_cumsum
    aqk = _empty((b, t, hv, CHUNK), k)                                       # chunk_kda_fwd_intra
    akk = torch.zeros_like(aqk)
    akkd = _empty((b, t, hv, SUB_CHUNK), k, torch.float32)
    w, u, _, kg = _w_u(k, v, hv, with_q=False)                               # its recompute_w_u_fwd
    del akkd                                                                 # chunk_kda_fwd_intra returns
    h, v_new = _empty((b, nt, hv, k.shape[-1], dv), kg), torch.empty_like(u)  # chunk_gated_delta_rule_fwd_h
    o = torch.zeros_like(v_new)                                              # chunk_gla_fwd_o_gk
    del w, u, kg, h, v_new
    return o, g_cum, aqk, akk


def _bwd_intra(dq: Any, dk: Any, db: Any, dg: Any) -> tuple[Any, Any, Any, Any]:
    """chunk_intra.py `chunk_kda_bwd_intra`: new dq, dk, dg and the sum of NK partial db (db2 freed on return)."""
    import torch

    nk = _cdiv(dq.shape[-1], min(INTRA_BK, _next_pow2(dq.shape[-1])))
    dq2, dk2 = torch.empty_like(dq), torch.empty_like(dk)
    db2 = _empty((nk, *db.shape), db, torch.float32)
    dg2 = torch.empty_like(dg, dtype=torch.float32)
    return dq2, dk2, db2.sum(0), dg2


def _bwd(q: Any, k: Any, v: Any, g: Any, beta: Any, akk: Any, do: Any) -> tuple[Any, Any, Any, Any, Any]:
    """chunk_kda_bwd: every intermediate alive until it returns (fla keeps them as locals)."""
    import torch

    b, t, h, dk_ = k.shape
    hv, dv_ = v.shape[2], v.shape[-1]
    nt = _cdiv(t, CHUNK)
    w, u, qg, kg = _w_u(k, v, hv, with_q=True)                               # recompute_w_u_fwd(q=q)
    hs, v_new = _empty((b, nt, hv, dk_, dv_), kg), torch.empty_like(u)       # chunk_gated_delta_rule_fwd_h
    daqk = _empty((b, t, hv, CHUNK), v_new, torch.float32)                   # chunk_kda_bwd_dAv
    dv = torch.empty_like(do)
    dh = _empty((b, nt, hv, dk_, dv_), qg)                                   # chunk_gated_delta_rule_bwd_dhu
    dv = torch.empty_like(dv)                                                # its dv2
    dq = _empty((b, t, hv, dk_), g, torch.float32)                           # chunk_kda_bwd_wy_dqkg_fused
    dk = _empty((b, t, hv, dk_), g, torch.float32)
    dv2 = torch.empty_like(v)
    dg = torch.empty_like(g, dtype=torch.float32)
    db = torch.empty_like(beta, dtype=torch.float32)
    dakk = torch.empty_like(akk, dtype=torch.float32)
    dv = dv2
    dq, dk, db, dg = _bwd_intra(dq, dk, db, dg)
    if hv > h:                                                               # GVA: .view(..., H, G, K).sum(3)
        dq, dk = _empty((b, t, h, dk_), dq), _empty((b, t, h, dk_), dk)
    dg = torch.empty_like(dg, dtype=torch.float32)                           # chunk_local_cumsum(reverse=True)
    del w, u, qg, kg, hs, v_new, daqk, dh, dakk
    return dq, dk, dv, db, dg


def _kda_function() -> Any:
    import torch

    class ChunkKDAStandIn(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, q: Any, k: Any, v: Any, g: Any, beta: Any, l2norm: bool) -> Any:
            guarded, qn, q_rstd, kn, k_rstd = _guarded_inputs(q, k, v, g, beta, l2norm)
            _, _, cv, cg, cbeta = guarded
            o, g_cum, aqk, akk = _fwd(qn, kn, cv, cg)
            ctx.save_for_backward(qn, q_rstd, kn, k_rstd, cv, g_cum, cg, cbeta, aqk, akk)
            del guarded
            ctx.l2norm = l2norm
            return o if o.dtype == qn.dtype else o.to(qn.dtype)                  # o.type_as(q)

        @staticmethod
        def backward(ctx: Any, do: Any) -> Any:
            q, _, k, _, v, g_cum, g, beta, _, akk = ctx.saved_tensors
            do = do.contiguous()                                                  # input_guard
            dq, dk, dv, db, dg = _bwd(q, k, v, g_cum, beta, akk, do)
            if ctx.l2norm:
                dq, dk = torch.empty_like(q), torch.empty_like(k)                 # l2norm_bwd: dx like y
            return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dg.to(g.dtype), db.to(beta.dtype), None

    return ChunkKDAStandIn


def chunk_kda(query: Any, key: Any, value: Any, g: Any, beta: Any, initial_state: Any = None,
              output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False, cu_seqlens: Any = None,
              **kwargs: Any) -> tuple[Any, Any]:
    """fla.ops.kda.chunk_kda for training ([B, T, H, K] inputs, gate and beta precomputed, no initial state)."""
    if initial_state is not None or output_final_state:
        raise NotImplementedError("the chunk_kda stand-in maps training (no recurrent state)")
    if cu_seqlens is not None or any(kwargs.get(f) for f in ("use_gate_in_kernel", "use_beta_sigmoid_in_kernel",
                                                              "safe_gate", "disable_recompute")):
        raise NotImplementedError("the chunk_kda stand-in maps transformers' call: one sequence per row, gate and "
                                  "beta computed outside the kernel, recompute in backward")
    return _kda_function().apply(query, key, value, g, beta, use_qk_l2norm_in_kernel), None


def refusal(name: str) -> Any:
    return fallback_refusal(name, "a Kimi Delta Attention layer", "flash-linear-attention and causal-conv1d")


def replacements() -> dict[str, Any]:
    """What `--kernels cuda` puts in a KDA modeling module: the kernels its training step calls, a refusal in place of
    the recurrent paths."""
    return {"chunk_kimi_delta_attention": chunk_kda, "causal_conv1d_fn": causal_conv1d_fn,
            **{f: refusal(f) for f in FALLBACKS}}


@contextlib.contextmanager
def kda_kernels(notes: list[str], job: Any) -> Iterator[None]:
    """Put fla's chunk_kda and causal-conv1d's stand-ins in the job's KDA modeling module while the block runs."""
    with stand_ins({name: replacements() for name in hybrid_modules(job, KDA_MODULES)}) as calls:
        yield
    if calls[0]:
        notes.append(f"Kimi Delta Attention: flash-linear-attention's chunk_kda and causal-conv1d's kernels stand in "
                     f"for transformers' torch fallbacks in {calls[0]} calls (hpcmem/trace/kernels_kda.py)")

"""`--kernels cuda` for Mamba-2 mixers (Mamba-2, Bamba, Falcon-H1, Granite-4 hybrids, Nemotron-H, Zamba2): what
mamba-ssm's fused kernel allocates and saves, in place of transformers' torch fallback (which keeps the whole scan).

transformers 5.24 resolves `mamba2_split_conv1d_scan_combined` at import (integrations/hub_kernels.py
`use_kernel_func_from_hub_with_fallback`): mamba_ssm.ops.triton.ssd_combined.mamba_split_conv1d_scan_combined when
mamba-ssm is installed, else a stub returning None. Each mixer (e.g. modeling_mamba2.py `Mamba2Mixer.forward`) calls
it `if self.training and cache is None` (TRL's SFTTrainer passes use_cache=False) with in_proj's output, the conv,
the gated RMSNorm's weight and out_proj's weight, and returns its output: on a GPU set up as transformers
recommends the conv, the scan, the norm and out_proj all run inside that one autograd Function. The stand-in below
allocates, saves and frees what its Python wrapper does (the Triton/CUDA kernels allocate nothing), read from
mamba-ssm (github.com/state-spaces/mamba @e9594ce), mamba_ssm/ops/triton/ssd_combined.py
`MambaSplitConv1dScanCombinedFn`, with transformers' arguments (no extra non-SSM part: d_nonssm = 0):

- forward: causal-conv1d's `causal_conv1d_fwd_function` (Dao-AILab/causal-conv1d @0d2252d, cpp_functions.py) on xBC
  (a copy first if the row stride is not a multiple of 8: `ensure_stride`) → xBC_conv like xBC;
  `_mamba_chunk_scan_combined_fwd`: dt_out, dA_cumsum fp32 [B, H, NC, L] (ssd_chunk_state.py `_chunk_cumsum_fwd`),
  chunk states fp32 [B, NC, H, P, N] (`_chunk_state_fwd`), passed states [B, NC, H, P·N] in C's dtype + fp32 final
  states [B, H, P·N] (ssd_state_passing.py `_state_passing_fwd`), CB fp32 [B, NC, G, L, L] (ssd_bmm.py
  `_bmm_chunk_fwd`, freed on return), out (and out_x when z is gated in the scan) like x (ssd_chunk_scan.py
  `_chunk_scan_fwd`); with the RMSNorm weight, layernorm_gated.py `_layer_norm_fwd` → normed out like x + fp32 rstd
  [G·B·T]; out_proj's F.linear (weight cast to the autocast dtype under autocast). Saves zxbcdt, the conv weight and
  bias, out_x, A, D, dt_bias, seq_idx, the norm weight, rstd, out_proj's (cast) weight and bias.
- backward: recomputes the conv (xBC_conv) and the output before out_proj (out_recompute), allocates dzxbcdt like
  zxbcdt and dxBC, dout through out_proj, `_layer_norm_bwd` (dx like x, fp32 partial dw [rows, dim] with rows =
  ⌈SMs·⌈4/warps⌉/G⌉), `_mamba_chunk_scan_combined_bwd` (recomputes dA_cumsum, dt, CB, the fp32 states and passed
  states, dstates fp32 → bf16, the fp32 [B, H, NC, L] ddA terms, dB/dC fp32 with `nsplits` head splits, dcb fp32),
  out_proj's weight gradient [out, dim] and causal-conv1d's `causal_conv1d_bwd_function` (fp32 dweight/dbias cast
  back to the weight dtype); every local alive until the function that holds it returns.

SM count: the kernels size some fp32 partial sums by the device's multiprocessor count; SM_COUNT is an H100/H200's.
Under `--kernels cuda` the torch fallbacks of these modules (causal_conv1d_fn, the chunk scan, the recurrent update)
must never run: they are replaced by a refusal, so a path the mapping does not cover fails instead of reporting the
fallback's memory as the GPU's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from hpcmem.trace import kernels_mamba1
from hpcmem.trace.kernels_linear import _empty, hybrid_modules, stand_ins
from hpcmem.trace.kernels_mamba_common import _autocast_dtype, refusal

SM_COUNT = 132             # torch.cuda.get_device_properties(...).multi_processor_count of an H100/H200 SXM
MAMBA2_MODULES = ("mamba2", "bamba", "falcon_h1", "granitemoehybrid", "nemotron_h", "zamba2")
FALLBACKS = ("causal_conv1d_fn", "causal_conv1d_update", "mamba2_chunk_scan", "mamba2_selective_state_update")


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _nsplits(b: int, nc: int, h: int, g: int) -> int:
    """ssd_chunk_state.py `_chunk_state_bwd_db` (and `_chunk_scan_bwd_dC`, `_chunk_scan_bwd_dcb`): head splits."""
    ratio = h // g
    per_program = max(min(_cdiv(b * nc * h, SM_COUNT), ratio), 1)
    return _cdiv(ratio, per_program)


def _ensure_stride(t: Any) -> Any:
    """ssd_combined.py `ensure_stride`: a copy when the row stride is not a multiple of 8."""
    if t.shape[2] % 8:
        raise NotImplementedError(f"mamba_ssm requires the convolution channels ({t.shape[2]}) to be a multiple of 8")
    return t if t.stride(1) % 8 == 0 else t.contiguous()


def _conv_fwd(xbc: Any) -> Any:
    """causal_conv1d_fwd_function(rearrange(ensure_stride(xBC), "b s d -> b d s"), …): out = empty_like(x)."""
    import torch

    return torch.empty_like(_ensure_stride(xbc).transpose(1, 2)).transpose(1, 2)


def _scan_fwd(x: Any, c: Any, chunk: int, gated: bool) -> tuple[Any, Any, Any, Any, Any, Any]:
    """`_mamba_chunk_scan_combined_fwd`: (out, out_x, dt, dA_cumsum, states, final_states); CB freed on return."""
    import torch

    b, t, h, p = x.shape
    g, n = c.shape[2], c.shape[3]
    nc = _cdiv(t, chunk)
    f32 = torch.float32
    dt_out, da = _empty((b, h, nc, chunk), x, f32), _empty((b, h, nc, chunk), x, f32)   # _chunk_cumsum_fwd
    states = _empty((b, nc, h, p, n), x, f32)                                            # _chunk_state_fwd
    states, final = _empty((b, nc, h, p * n), c), _empty((b, h, p * n), x, f32)        # _state_passing_fwd
    cb = _empty((b, nc, g, chunk, chunk), x, f32)                                        # noqa: F841 _bmm_chunk_fwd
    out = _empty((b, t, h, p), x)                                                        # _chunk_scan_fwd
    out_x = _empty((b, t, h, p), x) if gated else None
    return out, out_x, dt_out, da, states, final


def _forward(ctx: Any, zxbcdt: Any, conv_w: Any, conv_b: Any, dt_bias: Any, a: Any, d: Any, chunk: int,
             seq_idx: Any, norm_w: Any, proj_w: Any, proj_b: Any, headdim: int, ngroups: int) -> Any:
    import torch

    b, t, width = zxbcdt.shape
    h = d.shape[0]
    dim = h * headdim
    n = (conv_w.shape[0] - dim) // ngroups // 2
    if width != 2 * dim + 2 * ngroups * n + h:
        raise NotImplementedError(f"in_proj width {width} is not 2·{dim} + 2·{ngroups}·{n} + {h}: mamba_ssm's "
                                  "split (d_nonssm) would not be zero")
    xbc = zxbcdt[..., dim:2 * dim + 2 * ngroups * n]
    seq_idx = seq_idx.contiguous() if seq_idx is not None else None
    xbc_conv = _conv_fwd(xbc)
    x = xbc_conv[..., :dim].unflatten(-1, (h, headdim))
    c = xbc_conv[..., dim + ngroups * n:].unflatten(-1, (ngroups, n))
    scan = _scan_fwd(x, c, chunk, gated=norm_w is None)      # its dt, dA_cumsum and states live until the return
    if norm_w is None:
        out, out_x = scan[0].flatten(2), scan[1]
        rstd = None
    else:
        out_x = scan[0]
        out = _empty((b * t, dim), out_x).view(b, t, dim)                                   # _layer_norm_fwd
        rstd = _empty((ngroups * b * t,), out_x, torch.float32)
    ctx.proj_w_dtype = proj_w.dtype if proj_w is not None else None
    if proj_w is not None:
        dtype = _autocast_dtype()
        if dtype is not None:
            out, proj_w = out.to(dtype), proj_w.to(dtype)
            proj_b = proj_b.to(dtype) if proj_b is not None else None
        out = _empty((b, t, proj_w.shape[0]), out)                                         # F.linear
    ctx.save_for_backward(zxbcdt, conv_w, conv_b, out_x, a, d, dt_bias, seq_idx, norm_w, rstd, proj_w, proj_b)
    ctx.shape = (h, headdim, ngroups, n, chunk)
    return out


# -- backward: the wrappers' allocations, function by function, so locals live as long as mamba_ssm's ---------------
def _state_passing_bwd(x: Any, bsz: int, nc: int, h: int, pn: int) -> tuple[Any, Any, Any]:
    """ssd_state_passing.py `_state_passing_bwd` with dstates/states dtype = x's: (dstates, ddA_chunk, states)."""
    import torch

    dstates, states = _empty((bsz, nc, h, pn), x), _empty((bsz, nc, h, pn), x)
    part = _empty((bsz, h, nc, _cdiv(pn, 64)), x, torch.float32)  # noqa: F841 - alive until the return
    return dstates, _empty((bsz, h, nc), x, torch.float32), states


def _split_reduce(x: Any, shape: tuple[int, ...], splits: int) -> Any:
    """An fp32 buffer with a split axis at 2, summed over it (`dB.sum(2)`, `dC.sum(2)`, `dcb.sum(2)`)."""
    import torch

    part = _empty((*shape[:2], splits, *shape[2:]), x, torch.float32)  # noqa: F841 - freed after the sum
    return _empty(shape, x, torch.float32)


def _ddacs_stable(x: Any, bsz: int, h: int, nc: int, chunk: int) -> Any:
    """ssd_chunk_scan.py `_chunk_scan_bwd_ddAcs_stable`: [B, H, NC, ⌈L/32⌉, L] fp32 summed over axis 3."""
    import torch

    part = _empty((bsz, h, nc, _cdiv(chunk, 32), chunk), x, torch.float32)  # noqa: F841
    return _empty((bsz, h, nc, chunk), x, torch.float32)


def _flip_cumsum_flip(t: Any) -> Any:
    """`ddA_cumsum_prev.flip([-1]).cumsum(dim=-1).flip([-1])`: two temporaries alive in turn."""
    import torch

    first = torch.empty_like(t)
    second = torch.empty_like(first)
    del first
    return torch.empty_like(second)


def _scan_bwd(dout: Any, x: Any, dt: Any, c: Any, d: Any, chunk: int, z: Any, recompute: bool) -> tuple[Any, ...]:
    """`_mamba_chunk_scan_combined_bwd` with dx, ddt, dB, dC given (views of dzxbcdt and dxBC): returns
    (dA, dD, ddt_bias, outz); every intermediate is alive until it returns."""
    import torch

    f32 = torch.float32
    bsz, t, h, p = x.shape
    g, n = c.shape[2], c.shape[3]
    nc, ns = _cdiv(t, chunk), _nsplits(bsz, _cdiv(t, chunk), h, g)
    dt_in = dt.clone()                                                                   # noqa: F841
    da, dt_c = _empty((bsz, h, nc, chunk), x, f32), _empty((bsz, h, nc, chunk), x, f32)   # noqa: F841 cumsum
    cb = _empty((bsz, nc, g, chunk, chunk), x, f32)                                      # noqa: F841 _bmm_chunk_fwd
    states = _empty((bsz, nc, h, p, n), x, f32)                                          # _chunk_state_fwd
    states, final = _empty((bsz, nc, h, p * n), x, f32), _empty((bsz, h, p * n), x, f32)   # noqa: F841 passing
    outz = None
    if z is not None:                                                                    # _chunk_scan_bwd_dz
        dd_part = _empty((_cdiv(chunk, 32), bsz, nc, h, 1), x, f32)
        outz = _empty((bsz, t, h, p), x) if recompute else None
        dout = torch.empty_like(dout)                                                    # dout_x
        del dd_part
    dstates = _empty((bsz, nc, h, p, n), x, f32)                                         # _chunk_scan_bwd_dstates
    passed = _state_passing_bwd(x, bsz, nc, h, p * n)                                    # noqa: F841
    del dstates, states                                                                  # rebound in mamba_ssm
    dd_part = _empty((_cdiv(chunk, 32), bsz, nc, h, 1), x, f32)                          # ..._state_bwd_dx: dD
    ddt = _empty((bsz, h, nc, chunk), x, f32)                                            # noqa: F841 its ddt
    del dd_part
    dd = _empty((h,), d)
    dda_next = _empty((bsz, h, nc, chunk), x, f32)                                       # _chunk_state_bwd_db
    db = _split_reduce(x, (bsz, t, g, n), ns)                                            # noqa: F841
    dda_prev = _empty((bsz, h, nc, chunk), x, f32)                                       # _chunk_scan_bwd_dC
    dc = _split_reduce(x, (bsz, t, g, n), ns)                                            # noqa: F841
    dcb = _split_reduce(x, (bsz, nc, g, chunk, chunk), ns)                               # noqa: F841 _bwd_dcb
    dda_prev = _flip_cumsum_flip(dda_prev)
    dda = _ddacs_stable(x, bsz, h, nc, chunk)                                            # noqa: F841
    tmp = torch.empty_like(dda_next)                                                     # ddA_next + ddA_prev
    del tmp
    dt_bias_grad, d_a = _empty((h,), x, f32), _empty((h,), x, f32)                       # _chunk_cumsum_bwd
    return d_a, dd, dt_bias_grad, outz


def _layer_norm_bwd(x: Any, norm_w: Any, ngroups: int) -> tuple[Any, Any]:
    """layernorm_gated.py `_layer_norm_bwd` with dz and the recomputed output given: (dx, dw)."""
    import torch

    dim = x.shape[1]
    dx = torch.empty_like(x)
    block = min(65536 // x.element_size(), 1 << (dim // ngroups - 1).bit_length())
    warps = min(max(block // 256, 1), 8)
    rows = _cdiv(SM_COUNT * _cdiv(4, warps), ngroups)
    part = _empty((rows, dim), norm_w, torch.float32)                                    # noqa: F841 _dw
    dw = _empty((dim,), norm_w, torch.float32)                                           # _dw.sum(0)
    return dx, dw if norm_w.dtype == torch.float32 else _empty((dim,), norm_w)


def _conv_bwd(xbc: Any, dxbc: Any, dxbc_given: Any, conv_w: Any, conv_b: Any) -> tuple[Any, Any]:
    """causal_conv1d_bwd_function with dx given: (dweight, dbias), fp32 zeros cast back to the weight dtype."""
    import torch

    x_in, dout, dx = _ensure_stride(xbc), _ensure_stride(dxbc), _ensure_stride(dxbc_given)   # noqa: F841
    dweight = torch.zeros_like(conv_w, dtype=torch.float32).type_as(conv_w)
    dbias = torch.zeros_like(conv_b, dtype=torch.float32).type_as(conv_b) if conv_b is not None else None
    return dweight, dbias


def _backward(ctx: Any, dout: Any) -> tuple[Any, ...]:
    import torch

    zxbcdt, conv_w, conv_b, out, _a, d, _dt_bias, _seq_idx, norm_w, _rstd, proj_w, proj_b = ctx.saved_tensors
    h, p, g, n, chunk = ctx.shape
    bsz, t, _ = zxbcdt.shape
    dim = h * p
    recompute = proj_w is not None
    out_recompute = _empty((bsz, t, dim), out) if recompute else None
    z, xbc, dt = zxbcdt[..., :dim], zxbcdt[..., dim:2 * dim + 2 * g * n], zxbcdt[..., 2 * dim + 2 * g * n:]
    xbc_conv = _conv_fwd(xbc)
    x = xbc_conv[..., :dim].unflatten(-1, (h, p))
    c = xbc_conv[..., dim + g * n:].unflatten(-1, (g, n))
    dzxbcdt = torch.empty_like(zxbcdt)
    dxbc_given = dzxbcdt[..., dim:2 * dim + 2 * g * n]
    dxbc = torch.empty_like(xbc)
    dout_og = dout
    if recompute:
        dout = _empty((bsz, t, dim), dout, _autocast_dtype())                           # F.linear(dout, W.t())
    d_norm = None
    if norm_w is None:
        d_a, dd, ddt_bias, out_for_linear = _scan_bwd(dout, x, dt, c, d, chunk, z=z, recompute=recompute)
    else:
        dy_rms = dout                                                                    # noqa: F841 a local
        dout, d_norm = _layer_norm_bwd(out.flatten(0, 1).flatten(1), norm_w, g)
        out_for_linear = out_recompute
        d_a, dd, ddt_bias, _ = _scan_bwd(dout.view(bsz, t, h, p), x, dt, c, d, chunk, z=None, recompute=False)
    d_proj_w = d_proj_b = None
    if recompute:
        d_proj_w = _empty((proj_w.shape[0], dim), dout_og, _autocast_dtype())           # einsum bso,bsd->od
        d_proj_b = _empty((proj_w.shape[0],), dout_og) if proj_b is not None else None   # dout_og.sum((0, 1))
    del out_for_linear
    d_conv_w, d_conv_b = _conv_bwd(xbc, dxbc, dxbc_given, conv_w, conv_b)
    return (dzxbcdt, d_conv_w, d_conv_b, ddt_bias, d_a, dd, None, None, d_norm, d_proj_w, d_proj_b, None, None)


def _split_scan_function() -> Any:
    import torch

    class MambaSplitConv1dScanCombinedStandIn(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, zxbcdt: Any, conv_w: Any, conv_b: Any, dt_bias: Any, a: Any, d: Any, chunk: int,
                    seq_idx: Any, norm_w: Any, proj_w: Any, proj_b: Any, headdim: int, ngroups: int) -> Any:
            return _forward(ctx, zxbcdt, conv_w, conv_b, dt_bias, a, d, chunk, seq_idx, norm_w, proj_w, proj_b,
                            headdim, ngroups)

        @staticmethod
        def backward(ctx: Any, dout: Any) -> Any:
            return _backward(ctx, dout)

    return MambaSplitConv1dScanCombinedStandIn


def mamba_split_conv1d_scan_combined(zxbcdt: Any, conv1d_weight: Any, conv1d_bias: Any, dt_bias: Any, A: Any,
                                     D: Any, chunk_size: int, initial_states: Any = None, seq_idx: Any = None,
                                     dt_limit: Any = None, return_final_states: bool = False,
                                     activation: str = "silu", rmsnorm_weight: Any = None, rmsnorm_eps: float = 1e-6,
                                     outproj_weight: Any = None, outproj_bias: Any = None, headdim: int | None = None,
                                     ngroups: int = 1, norm_before_gate: bool = True, **_: Any) -> Any:
    """mamba_ssm's mamba_split_conv1d_scan_combined for training (no initial or final states, D per head)."""
    if initial_states is not None or return_final_states:
        raise NotImplementedError("the Mamba-2 stand-in maps training (no initial or final states)")
    if D.dim() != 1 or headdim is None:
        raise NotImplementedError("the Mamba-2 stand-in maps D per head with headdim given (transformers' call)")
    if outproj_weight is None and outproj_bias is not None:
        raise ValueError("mamba_split_conv1d_scan_combined: outproj_bias without outproj_weight")
    return _split_scan_function().apply(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size, seq_idx,
                                        rmsnorm_weight, outproj_weight, outproj_bias, headdim, ngroups)


def replacement_table() -> dict[str, dict[str, Any]]:
    """modeling module → {function name: what `--kernels cuda` puts there}, Mamba-2 and Mamba-1 mixers."""
    mamba2 = {"mamba2_split_conv1d_scan_combined": mamba_split_conv1d_scan_combined,
              **{f: refusal(f) for f in FALLBACKS}}
    table = {m: mamba2 for m in MAMBA2_MODULES}
    return table | {m: kernels_mamba1.replacements(m)
                    for m in kernels_mamba1.INNER_MODULES + kernels_mamba1.SCAN_MODULES}


@contextlib.contextmanager
def mamba_kernels(notes: list[str], job: Any) -> Iterator[None]:
    """Put mamba-ssm's (and causal-conv1d's) kernels' stand-ins in the job's Mamba modeling module, and a refusal in
    place of every torch fallback there, while the block runs."""
    table = replacement_table()
    with stand_ins({name: table[name] for name in hybrid_modules(job, tuple(table))}) as calls:
        yield
    if calls[0]:
        notes.append(f"Mamba mixers: mamba-ssm's and causal-conv1d's kernels stand in for transformers' torch "
                     f"fallbacks in {calls[0]} calls (hpcmem/trace/kernels_mamba.py, kernels_mamba1.py)")

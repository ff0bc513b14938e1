"""`--kernels cuda` for Mamba-1 mixers (Mamba, Falcon-Mamba; the Mamba layers of Jamba and Zamba): what mamba-ssm's
selective-scan kernels allocate and save, in place of transformers' torch fallback (which keeps the whole scan).

transformers 5.24 resolves `mamba_inner_fn` and `selective_scan_fn` from mamba_ssm.ops.selective_scan_interface at
import (integrations/hub_kernels.py `use_kernel_func_from_hub_with_fallback`), `causal_conv1d_fn` from causal-conv1d.
In training (`self.training and cache is None`; TRL passes use_cache=False) `MambaMixer.forward` and
`FalconMambaMixer.forward` call mamba_inner_fn (conv, x_proj, dt_proj, scan and out_proj in one autograd Function);
`JambaMambaMixer.forward` and `ZambaMambaMixer.forward` call causal_conv1d_fn (causal-conv1d's CausalConv1dFn:
hpcmem/trace/kernels_linear.py) and then selective_scan_fn (once per Mamba head in Zamba). Both need mamba-ssm's
compiled `selective_scan_cuda` extension, which mamba-ssm builds only with MAMBA_KEEP_CUDA_BUILD=TRUE since
github.com/state-spaces/mamba @f577286 ("Make CUDA selective scan install explicit opt-in"); without it the GPU run
stops with mamba-ssm's RuntimeError (`_check_selective_scan_cuda`) rather than falling back. The stand-ins map a
node where it is built. Read from mamba-ssm @e9594ce:

1. `SelectiveScanFn` (mamba_ssm/ops/selective_scan_interface.py): u, delta, B, C, z made contiguous where their last
   stride is not 1, D contiguous; csrc/selective_scan/selective_scan.cpp `selective_scan_fwd` allocates out like
   delta, out_z like z and the chunk states x fp32 [B, D, ⌈L/2048⌉, 2·N]; saves u, delta, A, B, C, D, z, delta_bias,
   x, out. Backward: dout contiguous, `selective_scan_bwd` allocates dz like z, du like u, ddelta like delta, fp32
   zeros dA, dB, dC (variable B/C in fp32), dD, ddelta_bias, and returns dB, dC cast to their input dtype.
2. `MambaInnerFn` (same file, checkpoint_lvl 1): the projection weights cast to the autocast dtype, xz made
   contiguous, causal-conv1d's `causal_conv1d_fwd_function` on its x half, x_dbl = F.linear(conv_out as (b l) d,
   x_proj), delta = dt_proj @ x_dbl[:, :R]ᵀ, B and C copied to [b, 1, N, l] (Falcon-Mamba: each RMS-normed through
   mamba_ssm/ops/triton/layer_norm.py `_layer_norm_fwd`, as is delta), the scan (1.), conv_out and delta dropped;
   saves xz, x_dbl, the cast weights, A, B, C, D, delta_bias, x, out; returns F.linear(out_zᵀ, out_proj). Backward
   recomputes conv_out and delta (and the norms), allocates dxz like xz, dout_y = out_projᵀ @ dout, the scan's
   backward with dz given and out_z recomputed, out_proj's weight gradient, dx_dbl, the dt_proj and x_proj weight
   gradients and causal-conv1d's `causal_conv1d_bwd_function` with dx given.

Under `--kernels cuda` the torch fallbacks of these modules never run: they are replaced by a refusal.
"""

from __future__ import annotations

from typing import Any

from hpcmem.trace.kernels_linear import _empty, causal_conv1d_fn
from hpcmem.trace.kernels_mamba_common import _autocast_dtype, refusal

SCAN_CHUNK = 2048          # selective_scan.cpp: n_chunks = (seqlen + 2048 - 1) / 2048
INNER_MODULES = ("mamba", "falcon_mamba")      # training calls mamba_inner_fn
SCAN_MODULES = ("jamba", "zamba")              # training calls causal_conv1d_fn, then selective_scan_fn
FALLBACKS = ("causal_conv1d_update", "mamba_selective_state_update")


# -- 1: SelectiveScanFn ---------------------------------------------------------------------------------------------
def _scan_fwd_cpp(u: Any, delta: Any, a: Any, z: Any) -> tuple[Any, Any, Any]:
    """selective_scan.cpp `selective_scan_fwd`: (out, x, out_z)."""
    import torch

    b, d, length = u.shape
    out_z = torch.empty_like(z) if z is not None else None
    out = torch.empty_like(delta)
    x = _empty((b, d, -(-length // SCAN_CHUNK), 2 * a.shape[-1]), u, a.dtype)
    return out, x, out_z


def _scan_bwd_cpp(u: Any, delta: Any, a: Any, b: Any, c: Any, d: Any, z: Any, delta_bias: Any, out: Any, dz: Any,
                  recompute_out_z: bool) -> tuple[Any, ...]:
    """selective_scan.cpp `selective_scan_bwd`: (du, ddelta, dA, dB, dC, dD, ddelta_bias, dz, out_z)."""
    import torch

    f32 = torch.float32
    if z is not None and dz is None:
        dz = torch.empty_like(z)
    out_z = torch.empty_like(out) if z is not None and recompute_out_z else None
    du, ddelta, da = torch.empty_like(u), torch.empty_like(delta), torch.zeros_like(a)
    db = torch.zeros_like(b, dtype=f32) if b.dim() >= 3 else torch.zeros_like(b)
    dc = torch.zeros_like(c, dtype=f32) if c.dim() >= 3 else torch.zeros_like(c)
    dd = torch.zeros_like(d) if d is not None else None
    ddelta_bias = torch.zeros_like(delta_bias) if delta_bias is not None else None
    return du, ddelta, da, db.to(b.dtype), dc.to(c.dtype), dd, ddelta_bias, dz, out_z


def _contiguous_last(t: Any) -> Any:
    return t.contiguous() if t is not None and t.stride(-1) != 1 else t


def _selective_scan_function() -> Any:
    import torch

    class SelectiveScanStandIn(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, u: Any, delta: Any, a: Any, b: Any, c: Any, d: Any, z: Any, delta_bias: Any,
                    softplus: bool) -> Any:
            u, delta, b, c, z = (_contiguous_last(t) for t in (u, delta, b, c, z))
            d = d.contiguous() if d is not None else None
            ctx.squeeze = (b.dim() == 3, c.dim() == 3)
            b = b.unsqueeze(1) if b.dim() == 3 else b
            c = c.unsqueeze(1) if c.dim() == 3 else c
            out, x, out_z = _scan_fwd_cpp(u, delta, a, z)
            ctx.save_for_backward(u, delta, a, b, c, d, z, delta_bias, x, out)
            return out_z if z is not None else out

        @staticmethod
        def backward(ctx: Any, dout: Any) -> Any:
            u, delta, a, b, c, d, z, delta_bias, _x, out = ctx.saved_tensors
            dout = _contiguous_last(dout)
            du, ddelta, da, db, dc, dd, ddb, dz, _ = _scan_bwd_cpp(u, delta, a, b, c, d, z, delta_bias,
                                                                  out if z is not None else None, None, False)
            db = db.squeeze(1) if ctx.squeeze[0] else db
            dc = dc.squeeze(1) if ctx.squeeze[1] else dc
            return du, ddelta, da, db, dc, dd, dz, ddb, None

    return SelectiveScanStandIn


def selective_scan_fn(u: Any, delta: Any, A: Any, B: Any, C: Any, D: Any = None, z: Any = None,
                      delta_bias: Any = None, delta_softplus: bool = False, return_last_state: bool = False,
                      **_: Any) -> Any:
    """mamba_ssm's selective_scan_fn for training (no last state)."""
    if return_last_state:
        raise NotImplementedError("the selective-scan stand-in maps training (no last state)")
    return _selective_scan_function().apply(u, delta, A, B, C, D, z, delta_bias, delta_softplus)


# -- 2: MambaInnerFn ------------------------------------------------------------------------------------------------
def _rms(t: Any) -> Any:
    """selective_scan_interface.py `rms_norm_forward` → layer_norm.py `_layer_norm_fwd`: y like x (fp32 rstd [M]
    freed on return)."""
    import torch

    t = _contiguous_last(t)
    rstd = _empty((t.shape[0],), t, torch.float32)  # noqa: F841 - alive until the return
    return torch.empty_like(t)


def _norm_bc(t: Any, weight: Any) -> Any:
    """B or C [b, 1, N, l] → (b l) N, RMS-normed, → b 1 N l, each step `.contiguous()` as MambaInnerFn does."""
    if weight is None:
        return t
    b, _, n, length = t.shape
    flat = _rms(t.squeeze(1).transpose(1, 2).reshape(b * length, n).contiguous())
    return flat.view(b, length, n).transpose(1, 2).unsqueeze(1).contiguous()


def _delta(dt_proj_w: Any, x_dbl: Any, bsz: int, length: int, dt_rms: Any) -> Any:
    """rearrange(delta_proj_weight @ x_dbl[:, :R].t(), "d (b l) -> b d l"), RMS-normed for Falcon-Mamba."""
    delta = (dt_proj_w @ x_dbl[:, :dt_proj_w.shape[1]].t()).view(-1, bsz, length).permute(1, 0, 2)
    if dt_rms is None:
        return delta
    d = delta.shape[1]
    flat = _rms(delta.transpose(1, 2).reshape(bsz * length, d).contiguous())
    return flat.view(bsz, length, d).transpose(1, 2).contiguous()


def _bc_from(x_dbl: Any, start: int, n: int, bsz: int, length: int, weight: Any) -> Any:
    """rearrange(x_dbl[:, start:start + N], "(b l) dstate -> b 1 dstate l").contiguous(), then the norm."""
    return _norm_bc(x_dbl[:, start:start + n].view(bsz, length, n).transpose(1, 2).unsqueeze(1).contiguous(), weight)


def _inner_forward(ctx: Any, xz: Any, conv_w: Any, conv_b: Any, x_proj_w: Any, dt_proj_w: Any, out_proj_w: Any,
                   a: Any, d: Any, delta_bias: Any, rms: tuple[Any, Any, Any]) -> Any:
    import torch
    import torch.nn.functional as F

    dtype = _autocast_dtype()
    if dtype is not None:
        x_proj_w, dt_proj_w, out_proj_w = (w.to(dtype) for w in (x_proj_w, dt_proj_w, out_proj_w))
    xz = _contiguous_last(xz)
    bsz, length, rank, n = xz.shape[0], xz.shape[-1], dt_proj_w.shape[1], a.shape[-1]
    conv_w = conv_w.squeeze(1)                                           # rearrange "d 1 w -> d w"
    x, z = xz.chunk(2, dim=1)
    conv_out = torch.empty_like(x)                                       # causal_conv1d_fwd_function
    x_dbl = F.linear(conv_out.transpose(1, 2).reshape(bsz * length, -1), x_proj_w)
    delta = _delta(dt_proj_w, x_dbl, bsz, length, rms[2])
    b = _bc_from(x_dbl, rank, n, bsz, length, rms[0])
    c = _bc_from(x_dbl, rank + n, n, bsz, length, rms[1])
    d = d.contiguous() if d is not None else None
    out, xs, out_z = _scan_fwd_cpp(conv_out, delta, a, z)
    conv_out, delta = None, None                                         # checkpoint_lvl 1: recomputed in backward
    ctx.save_for_backward(xz, conv_w, conv_b, x_dbl, x_proj_w, dt_proj_w, out_proj_w, a, b, c, d, delta_bias, xs,
                          out)
    ctx.rms = rms
    return F.linear(out_z.transpose(1, 2), out_proj_w)


def _inner_backward(ctx: Any, dout: Any) -> tuple[Any, ...]:
    import torch

    xz, conv_w, conv_b, x_dbl, x_proj_w, dt_proj_w, out_proj_w, a, b, c, d, delta_bias, _xs, out = ctx.saved_tensors
    bsz, length, rank, n = xz.shape[0], xz.shape[-1], dt_proj_w.shape[1], a.shape[-1]
    x, z = xz.chunk(2, dim=1)
    dout = _contiguous_last(dout)
    conv_out = torch.empty_like(x)                                       # causal_conv1d_fwd_function (recompute)
    delta = _delta(dt_proj_w, x_dbl, bsz, length, ctx.rms[2])
    b, c = _norm_bc(b, ctx.rms[0]), _norm_bc(c, ctx.rms[1])
    dxz = torch.empty_like(xz)
    _dx, dz = dxz.chunk(2, dim=1)                                         # dx: causal-conv1d's, given
    dout = dout.permute(2, 0, 1).reshape(dout.shape[2], -1)              # "b l e -> e (b l)"
    dout_y = (out_proj_w.t() @ dout).view(-1, bsz, length).permute(1, 0, 2)  # noqa: F841 - the scan's dout
    dconv_out, ddelta, da, db, dc, dd, ddb, dz, out_z = _scan_bwd_cpp(conv_out, delta, a, b, c, d, z, delta_bias,
                                                                      out, dz, True)
    dout_proj_w = torch.einsum("eB,dB->ed", dout, out_z.permute(1, 0, 2).reshape(out_z.shape[1], -1))
    dx_dbl = torch.empty_like(x_dbl)
    dx_dbl[:, rank:rank + n] = db.squeeze(1).transpose(1, 2).reshape(bsz * length, n).contiguous()
    db = None
    dx_dbl[:, -n:] = dc.squeeze(1).transpose(1, 2).reshape(bsz * length, n).contiguous()
    dc = None
    ddelta = ddelta.permute(1, 0, 2).reshape(ddelta.shape[1], -1)        # "b d l -> d (b l)"
    ddt_proj_w = torch.einsum("dB,Br->dr", ddelta, x_dbl[:, :rank])
    dx_dbl[:, :rank] = torch.einsum("dB,dr->Br", ddelta, dt_proj_w)
    dconv_out = dconv_out.permute(1, 0, 2).reshape(dconv_out.shape[1], -1)
    dx_proj_w = torch.einsum("Br,Bd->rd", dx_dbl, conv_out.transpose(1, 2).reshape(bsz * length, -1))
    dconv_out = torch.addmm(dconv_out, x_proj_w.t(), dx_dbl.t(), out=dconv_out)
    dweight = torch.zeros_like(conv_w, dtype=torch.float32).type_as(conv_w)   # causal_conv1d_bwd_function, dx given
    dbias = torch.zeros_like(conv_b, dtype=torch.float32).type_as(conv_b) if conv_b is not None else None
    return (dxz, dweight.unsqueeze(1), dbias, dx_proj_w, ddt_proj_w, dout_proj_w, da, dd, ddb, None, None, None)


def _inner_function() -> Any:
    import torch

    class MambaInnerStandIn(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, xz: Any, conv_w: Any, conv_b: Any, x_proj_w: Any, dt_proj_w: Any, out_proj_w: Any,
                    a: Any, d: Any, delta_bias: Any, b_rms: Any, c_rms: Any, dt_rms: Any) -> Any:
            return _inner_forward(ctx, xz, conv_w, conv_b, x_proj_w, dt_proj_w, out_proj_w, a, d, delta_bias,
                                  (b_rms, c_rms, dt_rms))

        @staticmethod
        def backward(ctx: Any, dout: Any) -> Any:
            return _inner_backward(ctx, dout)

    return MambaInnerStandIn


def mamba_inner_fn(xz: Any, conv1d_weight: Any, conv1d_bias: Any, x_proj_weight: Any, delta_proj_weight: Any,
                   out_proj_weight: Any, out_proj_bias: Any, A: Any, B: Any = None, C: Any = None, D: Any = None,
                   delta_bias: Any = None, B_proj_bias: Any = None, C_proj_bias: Any = None,
                   delta_softplus: bool = True, checkpoint_lvl: int = 1, b_rms_weight: Any = None,
                   c_rms_weight: Any = None, dt_rms_weight: Any = None, b_c_dt_rms_eps: float = 1e-6,
                   **_: Any) -> Any:
    """mamba_ssm's mamba_inner_fn as transformers calls it (input-dependent B and C, real A, checkpoint_lvl 1)."""
    if B is not None or C is not None or B_proj_bias is not None or C_proj_bias is not None or A.is_complex():
        raise NotImplementedError("the mamba_inner_fn stand-in maps input-dependent B and C with a real A")
    if out_proj_bias is not None or checkpoint_lvl != 1:
        raise NotImplementedError("the mamba_inner_fn stand-in maps checkpoint_lvl 1 without an out_proj bias "
                                  "(mamba_ssm sums that bias's gradient over the wrong axes)")
    return _inner_function().apply(xz, conv1d_weight, conv1d_bias, x_proj_weight, delta_proj_weight, out_proj_weight,
                                   A, D, delta_bias, b_rms_weight, c_rms_weight, dt_rms_weight)


def replacements(module: str) -> dict[str, Any]:
    """What `--kernels cuda` puts in a Mamba-1 modeling module: the kernels its training step calls, and a refusal in
    place of every torch fallback."""
    if module in INNER_MODULES:
        return {"mamba_inner_fn": mamba_inner_fn,
                **{f: refusal(f) for f in ("causal_conv1d_fn", "mamba_selective_scan", *FALLBACKS)}}
    return {"causal_conv1d_fn": causal_conv1d_fn, "mamba_selective_scan": selective_scan_fn,
            **{f: refusal(f) for f in ("mamba_inner_fn", *FALLBACKS)}}

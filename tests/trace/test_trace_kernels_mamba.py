"""The Mamba kernels' stand-ins (hpcmem/trace/kernels_mamba.py, kernels_mamba1.py) on small fake tensors: what a
transformers Mamba mixer keeps alive after its training forward with the stand-ins in place, against byte counts
written out from mamba-ssm's own wrappers (ssd_combined.py MambaSplitConv1dScanCombinedFn, selective_scan_interface.py
MambaInnerFn / SelectiveScanFn, csrc/selective_scan/selective_scan.cpp); and the torch fallbacks refusing to run."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hpcmem.trace.tracker import StorageTracker  # noqa: E402

pytestmark = pytest.mark.torch
BF16 = torch.bfloat16


def _job(model_type: str) -> SimpleNamespace:
    return SimpleNamespace(model=SimpleNamespace(model_type=model_type, learned=None))


def _mixer_bytes(model_type: str, build, rows: int, length: int, hidden: int) -> tuple[int, int, list[str]]:
    """(bytes alive after the mixer's training forward beyond the module and its input, peak above that during the
    backward, notes), with `--kernels cuda`'s Mamba mapping in place."""
    from hpcmem.trace.fakeenv import fake_world
    from hpcmem.trace.kernels_mamba import mamba_kernels

    tracker, notes = StorageTracker(), []
    with fake_world() as (_, oracle), mamba_kernels(notes, _job(model_type)):
        oracle.observer = tracker
        mixer = build().to(BF16).train()
        x = torch.randn(rows, length, hidden, dtype=BF16, requires_grad=True)
        before = tracker.current_bytes
        out = mixer(x)
        assert out.shape == (rows, length, hidden) and out.dtype == BF16
        after = tracker.current_bytes
        tracker.reset_peak()
        out.sum().backward()
        oracle.observer = None
    return after - before, tracker.peak_bytes - after, notes


def test_mamba2_mixer_saves_what_the_split_conv1d_scan_kernel_saves():
    from transformers import Mamba2Config
    from transformers.models.mamba2.modeling_mamba2 import Mamba2Mixer

    b, t, hidden, h, p, g, n = 1, 128, 32, 8, 8, 2, 16      # dim = H·P = 64 = 2·hidden; chunk 64: 2 chunks
    cfg = Mamba2Config(hidden_size=hidden, num_heads=h, head_dim=p, expand=2, n_groups=g, state_size=n,
                       chunk_size=64, num_hidden_layers=1, use_bias=False, use_conv_bias=True)
    saved, bwd_peak, notes = _mixer_bytes("mamba2", lambda: Mamba2Mixer(cfg, layer_idx=0), b, t, hidden)
    dim, width = h * p, 2 * h * p + 2 * g * n + h                # zxbcdt: z, xBC, dt = 64 + 128 + 8 = 200
    # the mixer: A = -exp(A_log.float()) (exp's result kept by ExpBackward, A by the kernel) [H] fp32 each.
    # MambaSplitConv1dScanCombinedFn.forward saves zxbcdt (in_proj's output), out_x [B, T, H, P] (x's dtype) and
    # the gated RMSNorm's fp32 rstd [G·B·T]; it returns out_proj's output [B, T, hidden] in bf16.
    assert saved == 2 * h * 4 + b * t * width * 2 + b * t * dim * 2 + g * b * t * 4 + b * t * hidden * 2
    assert notes and "2 calls" not in notes[0] and "1 calls" in notes[0]
    # backward at its peak (chunk_scan_bwd_dcb's head-split fp32 partial dcb and its sum alive together):
    # out_recompute, the recomputed conv output, dzxbcdt, dxBC, dout through out_proj, the norm's dx and bf16 dw,
    # then _mamba_chunk_scan_combined_bwd's locals: dt clone, dA_cumsum + dt, CB, the fp32 final states, bf16
    # dstates + states (the fp32 chunk, passed and dstates freed on rebinding), the [B, H, NC] ddA, ddt, dD,
    # ddA_next, dB, ddA_prev, dC, and dcb with nsplits = 4 (4 heads per group, 1 head per program at B·NC·H = 16 < 132 SMs)
    nc, ns, f32 = 2, 4, 4
    alive = (b * t * dim * 2 + b * t * (dim + 2 * g * n) * 2 + b * t * width * 2 + b * t * (dim + 2 * g * n) * 2
             + b * t * dim * 2 + b * t * dim * 2 + dim * 2
             + b * t * h * 2 + 2 * b * h * nc * 64 * f32 + b * nc * g * 64 * 64 * f32
             + b * h * p * n * f32 + 2 * b * nc * h * p * n * 2 + b * h * nc * f32
             + b * h * nc * 64 * f32 + h * 2 + b * h * nc * 64 * f32 + b * t * g * n * f32
             + b * h * nc * 64 * f32 + b * t * g * n * f32
             + b * nc * ns * g * 64 * 64 * f32 + b * nc * g * 64 * 64 * f32)
    # … plus the mixer's own backward buffers alive then (out.sum()'s 2-byte gradient, the A/exp grads: ≤ 64 B)
    assert alive <= bwd_peak <= alive + 64


def test_mamba_mixer_saves_what_mamba_inner_fn_saves():
    from transformers import MambaConfig
    from transformers.models.mamba.modeling_mamba import MambaMixer

    b, t, hidden, n, r = 2, 128, 32, 16, 8                   # intermediate I = 64, dt rank 8
    i = 2 * hidden
    cfg = MambaConfig(hidden_size=hidden, state_size=n, expand=2, time_step_rank=r, num_hidden_layers=1,
                      use_bias=False, use_conv_bias=True)
    saved, _, notes = _mixer_bytes("mamba", lambda: MambaMixer(cfg, layer_idx=0), b, t, hidden)
    # the mixer: A = -exp(A_log.float()) [I, N] fp32 (exp's result kept too), D.float() and dt_proj.bias.float()
    # [I] fp32 (kept by the kernel). MambaInnerFn.forward saves xz made contiguous [B, 2I, T] (in_proj's output is
    # a transposed view), x_dbl [B·T, R + 2N], B and C copied to [B, 1, N, T], the scan's chunk states x fp32
    # [B, I, ⌈T/2048⌉, 2N] and out [B, I, T]; it returns out_proj's output [B, T, hidden].
    mixer = 2 * i * n * 4 + 2 * i * 4
    kernel = b * 2 * i * t * 2 + b * t * (r + 2 * n) * 2 + 2 * b * n * t * 2 + b * i * 1 * 2 * n * 4 + b * i * t * 2
    assert saved == mixer + kernel + b * t * hidden * 2
    assert notes and "1 calls" in notes[0]


def test_selective_scan_saves_its_inputs_made_contiguous_and_the_chunk_states():
    from hpcmem.trace.fakeenv import fake_world
    from hpcmem.trace.kernels_mamba1 import selective_scan_fn

    b, t, d, n = 2, 128, 64, 16
    tracker = StorageTracker()
    with fake_world() as (_, oracle):
        oracle.observer = tracker
        u = torch.randn(b, t, d, dtype=BF16, requires_grad=True)        # handed over transposed: copied
        delta = torch.randn(b, d, t, dtype=BF16, requires_grad=True)    # contiguous: kept as is
        bc = torch.randn(b, t, 2 * n, dtype=BF16, requires_grad=True)
        z = torch.randn(b, t, d, dtype=BF16, requires_grad=True)
        a, dd, bias = (torch.randn(s, requires_grad=True) for s in ((d, n), (d,), (d,)))
        before = tracker.current_bytes
        out = selective_scan_fn(u.transpose(1, 2), delta, a, bc[..., :n].transpose(1, 2), bc[..., n:].transpose(1, 2),
                                dd, z=z.transpose(1, 2), delta_bias=bias, delta_softplus=True)
        assert out.shape == (b, d, t) and out.dtype == BF16
        saved = tracker.current_bytes - before
        out.sum().backward()
        assert u.grad.shape == u.shape and bc.grad.dtype == BF16 and a.grad.dtype == torch.float32
        oracle.observer = None
    # u, B, C, z copied (last stride ≠ 1); x fp32 [B, D, 1, 2N]; out like delta; out_z like z (returned)
    assert saved == b * d * t * 2 + 2 * b * n * t * 2 + b * d * t * 2 + b * d * 2 * n * 4 + b * d * t * 2 + b * d * t * 2


def test_the_torch_fallbacks_refuse_to_run_under_the_mapping():
    import transformers.models.jamba.modeling_jamba as jamba
    import transformers.models.mamba2.modeling_mamba2 as mamba2

    from hpcmem.trace.kernels_mamba import mamba_kernels

    original = mamba2.mamba2_chunk_scan
    with mamba_kernels([], _job("mamba2")):
        with pytest.raises(RuntimeError, match="torch fallback mamba2_chunk_scan ran in a Mamba mixer"):
            mamba2.mamba2_chunk_scan(None, None, None, None, None, chunk_size=64)
        assert jamba.mamba_selective_scan.__name__ == "mamba_selective_scan"    # only the job's module is patched
    assert mamba2.mamba2_chunk_scan is original
    with mamba_kernels([], _job("jamba")), pytest.raises(RuntimeError, match="causal_conv1d_update"):
        jamba.causal_conv1d_update(None, None, None)

"""The linear-attention kernels' stand-ins (hpcmem/trace/kernels_linear.py) on small fake tensors: what stays alive
after forward and the backward's peak, against byte counts written out from the kernels' own wrappers."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from hpcmem.trace.tracker import StorageTracker  # noqa: E402

pytestmark = pytest.mark.torch
B, T, H, HV, K, V = 1, 128, 2, 4, 16, 16      # GVA: 4 value heads per 2 key heads, 2 chunks of 64


def _measure(fn) -> tuple[int, int, int]:
    """(bytes the inputs take, bytes alive after forward beyond them, peak above that during backward)."""
    from hpcmem.trace.fakeenv import fake_world

    tracker = StorageTracker()
    with fake_world() as (_, oracle):
        oracle.observer = tracker
        inputs, out = fn()
        after = tracker.current_bytes
        tracker.reset_peak()
        out.sum().backward()
        oracle.observer = None
    return inputs, after, tracker.peak_bytes - after


def test_gated_delta_rule_saves_what_fla_saves():
    from hpcmem.trace.kernels_linear import chunk_gated_delta_rule

    def run():
        bf16 = torch.bfloat16
        q = torch.randn(B, T, H, K, dtype=bf16, requires_grad=True)
        k = torch.randn(B, T, H, K, dtype=bf16, requires_grad=True)
        v = torch.randn(B, T, HV, V, dtype=bf16, requires_grad=True)
        g = torch.randn(B, T, HV, dtype=torch.float32, requires_grad=True)
        beta = torch.rand(B, T, HV, dtype=bf16, requires_grad=True)
        o, state = chunk_gated_delta_rule(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)
        assert state is None and o.shape == (B, T, HV, V) and o.dtype == bf16
        return None, o

    _, after, bwd_peak = _measure(run)
    inputs = 2 * (B * T * H * K * 2) + B * T * HV * V * 2 + B * T * HV * 4 + B * T * HV * 2
    # ChunkGatedDeltaRuleFunction.forward saves the L2-normed q, k (bf16) + their fp32 rstd, v and beta (contiguous
    # already: no copy), the fp32 chunk cumsum of g and A [B, T, HV, 64] in k's dtype; returns o like v.
    saved = 2 * (B * T * H * K * 2 + B * T * H * 4) + B * T * HV * 4 + B * T * HV * 64 * 2
    out = B * T * HV * V * 2
    assert after == inputs + saved + out
    # chunk_gated_delta_rule_bwd at its return: do (the ones of out.sum()'s backward), w, u, h and v_new recomputed
    # (NT = 2 chunks), dh, dv2, dq/dk (summed to H) + dw + dg, dk2 (summed) + dv + db + dg2, the reverse cumsum dg
    nt = T // 64
    w, u, h = B * T * HV * K * 2, B * T * HV * V * 2, B * nt * HV * K * V * 2
    alive = (out + w + u + h + u + h + u          # do, w, u, h, v_new, dh, dv (dv2; dv_local freed on rebinding)
             + 2 * B * T * H * K * 2 + w + B * T * HV * 4            # dq, dk (H heads), dw, dg (summed, fp32)
             + B * T * H * K * 2 + u + B * T * HV * 2 + B * T * HV * 4   # dk2, dv, db, dg2
             + B * T * HV * 4)                                       # dg after the reverse cumsum
    # … plus, for a moment, chunk_bwd_dqkwg's / prepare_wy_repr_bwd's HV-headed dq, dk, dk2 before their sum to H
    # heads and the NK = 1 partial dg (at most two of them at once), and the 1-element gradient of the sum
    assert alive <= bwd_peak <= alive + 2 * B * T * HV * K * 2 + 4


def test_causal_conv1d_keeps_its_input_and_returns_the_grads_in_the_weight_dtype():
    from hpcmem.trace.kernels_linear import causal_conv1d_fn

    C, W = 32, 4

    def run():
        x = torch.randn(B, T, C, dtype=torch.bfloat16, requires_grad=True).transpose(1, 2)   # channel-last view
        weight = torch.randn(C, W, dtype=torch.float32, requires_grad=True)
        bias = torch.randn(C, dtype=torch.float32, requires_grad=True)
        out = causal_conv1d_fn(x, weight, bias, activation="silu")
        assert out.shape == (B, C, T) and out.dtype == torch.bfloat16
        return None, out

    _, after, _ = _measure(run)
    x_bytes, w_bytes, b_bytes = B * T * C * 2, C * W * 4, C * 4
    # channel-last x is taken as is (no copy); saved x, weight, bias are the inputs; out like x
    assert after == x_bytes + w_bytes + b_bytes + x_bytes

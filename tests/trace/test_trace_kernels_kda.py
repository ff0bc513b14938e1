"""The Kimi Delta Attention stand-in (hpcmem/trace/kernels_kda.py) on small fake tensors: what chunk_kda keeps alive
after forward and its backward's peak, against byte counts written out from flash-linear-attention's wrappers
(fla/ops/kda/chunk.py ChunkKDAFunction, chunk_fwd.py, chunk_bwd.py, chunk_intra.py, wy_fast.py); a real Kimi-Linear
KDA layer reaching the stand-ins through its modeling module; the recurrent fallback refusing to run."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hpcmem.trace.tracker import StorageTracker  # noqa: E402

pytestmark = pytest.mark.torch
BF16 = torch.bfloat16
B, T, H, K = 1, 128, 2, 64            # 2 chunks of 64; K = V = 64 → chunk_kda_bwd_intra's NK = 64 / 32 = 2


def _job(model_type: str) -> SimpleNamespace:
    return SimpleNamespace(model=SimpleNamespace(model_type=model_type, learned=None))


def test_chunk_kda_saves_what_fla_saves():
    from hpcmem.trace.fakeenv import fake_world
    from hpcmem.trace.kernels_kda import chunk_kda

    tracker = StorageTracker()
    with fake_world() as (_, oracle):
        oracle.observer = tracker
        # q, k, v as the layer hands them over: views of one [B, T, 3·H·K] conv output (not contiguous)
        qkv = torch.randn(B, T, 3, H, K, dtype=BF16, requires_grad=True)
        g = torch.randn(B, T, H, K, dtype=torch.float32, requires_grad=True)
        beta = torch.rand(B, T, H, dtype=BF16, requires_grad=True)
        inputs = tracker.current_bytes
        o, state = chunk_kda(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], g=g, beta=beta,
                             use_qk_l2norm_in_kernel=True)
        assert state is None and o.shape == (B, T, H, K) and o.dtype == BF16
        after = tracker.current_bytes - inputs
        tracker.reset_peak()
        o.sum().backward()
        oracle.observer = None
    bwd_peak = tracker.peak_bytes - inputs - after
    x2, x4, rows = B * T * H * K * 2, B * T * H * K * 4, B * T * H
    a2, a4 = rows * 64 * 2, rows * 64 * 4                   # Aqk / Akk [B, T, H, 64] bf16, dAqk / dAkk fp32
    hs = B * (T // 64) * H * K * K * 2                      # h, dh [B, NT, H, K, V] bf16
    # ChunkKDAFunction.forward saves the L2-normed q, k (bf16) + their fp32 rstd per row, v (input_guard's
    # contiguous copy), the fp32 chunk cumsum of g, g and beta themselves (contiguous: no copy), Aqk and Akk;
    # returns o like v. The copies of q and k, Akkd, w, u, kg, h and v_new are freed by then.
    assert after == 2 * (x2 + rows * 4) + x2 + x4 + 2 * a2 + x2
    # chunk_kda_bwd at chunk_kda_bwd_intra's sum of the partial db: do (the contiguous ones of out.sum()'s
    # backward), w, u, qg, kg and h, v_new recomputed, dAqk, dh, dv (the first two freed on rebinding), the fused
    # wy/dqkg kernel's dq, dk, dg fp32 + db fp32 + dAkk fp32, the intra kernel's dq2, dk2, dg2 fp32, db2 fp32
    # [NK = 2, B, T, H] and its sum
    alive = (x2 + 4 * x2 + hs + x2 + a4 + hs + x2
             + 3 * x4 + rows * 4 + a4
             + 3 * x4 + 2 * rows * 4 + rows * 4)
    # … plus the 1-element gradient of the sum
    assert alive <= bwd_peak <= alive + 4


def test_kimi_linear_layer_runs_the_stand_ins_and_refuses_the_recurrent_fallback():
    from transformers import KimiLinearConfig
    from transformers.models.kimi_linear import modeling_kimi_linear as mk

    from hpcmem.trace.fakeenv import fake_world
    from hpcmem.trace.kernels_kda import kda_kernels

    cfg = KimiLinearConfig(hidden_size=64, linear_num_heads=H, linear_head_dim=K, linear_conv_kernel_dim=4,
                           num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2)
    notes: list[str] = []
    original = mk.recurrent_kimi_delta_attention
    with fake_world() as _, kda_kernels(notes, _job("kimi_linear")):
        layer = mk.KimiLinearDeltaAttention(cfg, layer_idx=0).to(BF16).train()
        x = torch.randn(B, T, 64, dtype=BF16, requires_grad=True)
        out = layer(x)
        assert out.shape == (B, T, 64)
        out.sum().backward()
        with pytest.raises(RuntimeError, match="recurrent_kimi_delta_attention"):
            mk.recurrent_kimi_delta_attention(x, x, x, x, x, None, False)
    assert mk.recurrent_kimi_delta_attention is original          # restored after the block
    # one call each of causal_conv1d_fn and chunk_kda, and the refused one
    assert notes and "in 3 calls" in notes[0]

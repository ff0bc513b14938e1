"""The RWKV WKV kernel's stand-in (hpcmem/trace/kernels_rwkv.py) on small fake tensors: what transformers' RWKV time
mixing keeps alive after its training forward with the stand-in in place, against byte counts written out from
transformers' RwkvLinearAttention (models/rwkv/modeling_rwkv.py) and the kernel's launchers (kernels-community
rwkv/torch-ext/torch_binding.cpp: no allocation); the kernel's limits, transformers' own checks raising from its own
line; the per-token loop refusing to run."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hpcmem.trace.tracker import StorageTracker  # noqa: E402

pytestmark = pytest.mark.torch
BF16 = torch.bfloat16
JOB = SimpleNamespace(model=SimpleNamespace(model_type="rwkv", learned=None, max_position_embeddings=1024))


def test_time_mixing_saves_what_the_wkv_function_saves():
    from transformers import RwkvConfig
    from transformers.models.rwkv.modeling_rwkv import RwkvSelfAttention

    from hpcmem.trace.fakeenv import fake_world
    from hpcmem.trace.kernels_rwkv import rwkv_kernels

    b, t, h, a = 2, 64, 32, 48                       # hidden 32, attention_hidden_size 48 (B·A = 96: a multiple of 32)
    cfg = RwkvConfig(hidden_size=h, attention_hidden_size=a, num_hidden_layers=1, context_length=t)
    tracker, notes = StorageTracker(), []
    with fake_world() as (_, oracle), rwkv_kernels(notes, JOB):
        oracle.observer = tracker
        mixer = RwkvSelfAttention(cfg, layer_id=0).to(BF16).train()
        x = torch.randn(b, t, h, dtype=BF16, requires_grad=True)
        before = tracker.current_bytes
        out, _ = mixer(x)
        saved = tracker.current_bytes - before
        assert out.shape == (b, t, h) and out.dtype == BF16
        out.sum().backward()
        assert mixer.time_decay.grad.dtype == BF16 and mixer.key.weight.grad.shape == (a, h)
        oracle.observer = None
    bth, bta = b * t * h * 2, b * t * a * 2
    # extract_key_value: the shifted input (time_shift) and the three mixes (each the input of its Linear), the three
    # (1 - time_mix) [1, 1, H] kept by their mul, sigmoid's output (receptance); key and value (the kernel's inputs).
    # RwkvLinearAttention: -exp(time_decay.float()) fp32 [A] and the output y [B, T, A] (returned as is in bf16).
    # receptance * y (output's input) and output's result [B, T, H].
    assert saved == bth + 3 * bth + 3 * h * 2 + bta + 2 * bta + a * 4 + bta + bta + bth
    assert notes and "in 1 calls" in notes[0]


def test_fp16_keys_are_copied_to_fp32_and_the_gradients_cast_back():
    from hpcmem.trace.fakeenv import fake_world
    from hpcmem.trace.kernels_rwkv import rwkv_kernels

    import transformers.models.rwkv.modeling_rwkv as rwkv

    b, t, c = 2, 128, 32
    tracker = StorageTracker()
    with fake_world() as (_, oracle), rwkv_kernels([], JOB):
        oracle.observer = tracker
        decay, first = (torch.randn(c, dtype=torch.float16, requires_grad=True) for _ in range(2))
        key, value = (torch.randn(b, t, c, dtype=torch.float16, requires_grad=True) for _ in range(2))
        before = tracker.current_bytes
        y, state = rwkv.rwkv_linear_attention(decay, first, key, value)
        saved = tracker.current_bytes - before
        assert state is None and y.dtype == torch.float16
        y.sum().backward()
        assert key.grad.dtype == torch.float16 and decay.grad.dtype == torch.float16
        oracle.observer = None
    # saved: time_decay fp32 [C], time_first / key / value as fp32 copies, y fp32; returned: y cast to fp16
    assert saved == c * 4 + c * 4 + 2 * b * t * c * 4 + b * t * c * 4 + b * t * c * 2


def test_the_kernel_limits_and_the_loop_refuse():
    from hpcmem.trace.fakeenv import fake_world
    from hpcmem.trace.kernels_rwkv import rwkv_kernels

    import transformers.models.rwkv.modeling_rwkv as rwkv

    from hpcmem.validate.random_trace import classify, origin

    original, kernel = rwkv.rwkv_linear_attention_cpu, rwkv.rwkv_cuda_kernel
    with fake_world(), rwkv_kernels([], JOB):
        w = torch.randn(32, dtype=BF16)
        # past context_length (1,024 here) transformers' RwkvLinearAttention.forward raises, from its own line: the
        # random oracle credits the refusal to the real code
        with pytest.raises(ValueError, match="Cannot process a batch with 1025 tokens") as past:
            rwkv.rwkv_linear_attention(w, w, *(torch.randn(1, 1025, 32, dtype=BF16) for _ in range(2)))
        assert origin(past.value).startswith("transformers/models/rwkv/modeling_rwkv.py:")
        assert classify(past.value).startswith("refused: ValueError: Cannot process a batch with 1025 tokens")
        with pytest.raises(RuntimeError, match="fp32 weights under bf16 autocast"):
            rwkv.rwkv_linear_attention(w.float(), w.float(), *(torch.randn(1, 8, 32, dtype=BF16) for _ in range(2)))
        with pytest.raises(ValueError, match="round multiple of 32"):
            w48 = torch.randn(48, dtype=BF16)
            rwkv.rwkv_linear_attention(w48, w48, *(torch.randn(1, 8, 48, dtype=BF16) for _ in range(2)))
        with pytest.raises(RuntimeError, match="per-token loop"):
            rwkv.rwkv_linear_attention_cpu(w, w, None, None)
    long_context = SimpleNamespace(model=SimpleNamespace(model_type="rwkv", learned=None, max_position_embeddings=4096))
    with fake_world(), rwkv_kernels([], long_context):
        # transformers lets 1,025 tokens through at context_length 4,096; the kernel, built with Tmax 1,024, would run
        # past its backward's per-token arrays: the trace refuses that itself
        with pytest.raises(NotImplementedError, match="at most 1024 tokens"):
            rwkv.rwkv_linear_attention(w, w, *(torch.randn(1, 1025, 32, dtype=BF16) for _ in range(2)))
        y, _ = rwkv.rwkv_linear_attention(w, w, *(torch.randn(1, 1024, 32, dtype=BF16) for _ in range(2)))
        assert y.shape == (1, 1024, 32)
    assert rwkv.rwkv_linear_attention_cpu is original and rwkv.rwkv_cuda_kernel is kernel

"""The CUDA mapping, the value oracle and the offloading emulation, on small fake tensors with hand-computed bytes."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from hpcmem.job.jobspec import JobSpec
from hpcmem.job.spec import TrainSpec
from hpcmem.models.spec import ModelSpec
from hpcmem.trace.tracker import StorageTracker  # noqa: E402

pytestmark = pytest.mark.torch
B, S, H, HK, D = 1, 256, 8, 2, 64


def tiny_job(**train) -> JobSpec:
    model = ModelSpec(name="tiny", model_type="llama", vocab_size=1000, hidden_size=128, intermediate_size=256,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                      tie_word_embeddings=False)
    return JobSpec(model=model, train=TrainSpec(trainer="sft", **{"max_length": 128, **train}))


def _sdpa_bytes(mapped: bool) -> tuple[int, int]:
    """(bytes live after forward, peak during backward) of one GQA SDPA call on fake bf16 tensors."""
    from hpcmem.trace.fakeenv import fake_world
    from hpcmem.trace.kernels import _flash_sdpa

    tracker = StorageTracker()
    with fake_world() as (_, oracle):
        q = torch.randn(B, H, S, D, dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(B, HK, S, D, dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(B, HK, S, D, dtype=torch.bfloat16, requires_grad=True)
        notes: list[str] = []
        ctx = _flash_sdpa(tracker, notes) if mapped else _null()
        with ctx:
            oracle.observer = tracker
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            after_forward = tracker.current_bytes
            tracker.reset_peak()
            out.sum().backward()
            oracle.observer = None
    return after_forward, tracker.peak_bytes


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return None


def test_cuda_flash_saves_what_cpu_flash_saves_and_adds_the_fa2_backward_workspace():
    out_bytes, lse_bytes = B * H * S * D * 2, B * H * S * 4
    fwd_cpu, bwd_cpu = _sdpa_bytes(mapped=False)
    fwd_cuda, bwd_cuda = _sdpa_bytes(mapped=True)
    assert fwd_cpu == out_bytes + lse_bytes                      # GQA: K/V stay unexpanded on the CPU kernel too
    assert fwd_cuda == out_bytes + lse_bytes + 16 + 8            # CUDA flash: + philox seed/offset (uint64)
    softmax_d, dq_accum = B * H * 256 * 4, B * 256 * H * 64 * 4
    dkv_expanded = 2 * B * S * H * D * 2
    grads = (B * H * S * D + 2 * B * HK * S * D) * 2
    assert bwd_cuda >= fwd_cuda + grads + softmax_d + dq_accum + dkv_expanded
    assert bwd_cuda > bwd_cpu                                    # the CPU kernel's workspace is invisible


def _fused_head_peak(mapped: bool) -> int:
    from trl.kernels.chunked_logprob import ChunkedLogProbFunction

    from hpcmem.trace.fakeenv import fake_world
    from hpcmem.trace.kernels import _fused_head_triton

    n, vocab, hidden = 512, 1000, 64
    tracker = StorageTracker()
    with fake_world() as (_, oracle):
        h = torch.randn(n, hidden, dtype=torch.bfloat16, requires_grad=True)
        w = torch.randn(vocab, hidden, dtype=torch.bfloat16, requires_grad=True)
        targets = torch.zeros(n, dtype=torch.long)
        with _fused_head_triton([]) if mapped else _null():
            oracle.observer = tracker
            logp, *_ = ChunkedLogProbFunction.apply(h, w, None, targets, 1.0, 32768, None, 1.0, ("log_probs",))
            logp.sum().backward()
            oracle.observer = None
    return tracker.peak_bytes


def test_fused_head_triton_path_has_no_fp32_tile_temporaries():
    n, vocab, hidden = 512, 1000, 64
    cpu, cuda = _fused_head_peak(False), _fused_head_peak(True)
    # the CPU fold upcasts the [n, vocab] tile and builds several fp32 tiles of the same size
    assert cpu - cuda >= 2 * n * vocab * 4
    mm_buf = n * 32768 * 2
    assert cuda < mm_buf + 8 * n * 4 + 2 * (n + vocab) * hidden * 4 + 4 * n * vocab


def test_oracle_answers_reads_from_known_values_and_defaults_the_rest():
    from hpcmem.trace.fakeenv import fake_world

    real_labels = torch.tensor([[5, 6, -100, 7]])
    with fake_world() as (_, oracle):
        labels = oracle.fake_of(real_labels)
        mask = labels != -100
        assert int(mask.sum()) == 3
        assert bool(mask.all()) is False
        x = torch.randn(1, 4, 32)                   # floats above MAX_KNOWN_FLOAT_NUMEL: no value kept
        assert x[mask].shape == (3, 32)             # boolean gather sized from the known mask
        loss = x.sum()
        assert float(loss) == 0.0 and bool(torch.isnan(loss)) is False
        step = torch.tensor(0.0)
        step += 1
        assert step.item() == 1.0                   # tiny float scalars keep their value (optimizer step counts)
        buf = torch.zeros(4, dtype=torch.long)
        view = buf[:2]
        view.add_(x.sum().long())                   # written from unknown values: the base is unknown too
        assert oracle.value_of(buf) is None
    assert sum(oracle.unknown_reads.values()) >= 2


def test_activation_offloading_moves_saved_tensors_to_the_host():
    from hpcmem.trace import run_trace

    plain = run_trace(tiny_job(gradient_checkpointing=False), kernels="cpu")
    offloaded = run_trace(tiny_job(gradient_checkpointing=False, activation_offloading=True), kernels="cpu")
    assert offloaded.offloaded_host_peak_bytes > 0
    assert offloaded.components["activation"] < plain.components["activation"]
    assert any("OffloadActivations" in n for n in offloaded.reimplemented)


def test_cuda_trace_of_a_tiny_model_rounds_and_maps():
    from hpcmem.trace import run_trace

    r = run_trace(tiny_job(gradient_checkpointing=False, dtype="bfloat16", per_device_train_batch_size=1),
                  kernels="cuda")
    assert all(v % 512 == 0 for v in r.components.values())
    assert any("flash attention" in n for n in r.reimplemented)
    assert any("Triton" in n for n in r.reimplemented)
    assert r.to_json()["trace"]["kernels"] == "cuda"


def test_the_fused_head_patch_leaves_no_stand_in_behind_in_modules_imported_later():
    """A module that copies chunked_logprob's names at import (chunked_divergence, the distillation trainer) keeps the
    originals when the trace's fused-head patch was the first to load them (fresh interpreter: nothing imported)."""
    import subprocess
    import sys

    code = ("from hpcmem.trace.kernels import _fused_head_triton\n"
            "with _fused_head_triton([]):\n"
            "    import trl.kernels.chunked_divergence, trl.trainer.distillation_trainer\n"   # as cuda_mapping does
            "import trl.kernels.chunked_logprob as c, trl.kernels.chunked_divergence as d\n"
            "import trl.trainer.distillation_trainer as t\n"
            "assert d._use_triton is c._use_triton and t._use_triton is c._use_triton, 'stand-in kept'\n"
            "assert d._addmm_fp32 is c._addmm_fp32, 'stand-in kept'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def _mla_forward_bytes(s: int, d_qk: int, d_v: int, masked: bool, mapped: bool = True,
                       heads: int = 2, kv_heads: int = 2) -> tuple[int, list[str]]:
    """(bytes live after forward, notes) of one causal MLA SDPA call (value heads of another size)."""
    from hpcmem.trace.fakeenv import fake_world
    from hpcmem.trace.kernels import _flash_sdpa

    tracker, notes = StorageTracker(), []
    with fake_world() as (_, oracle), (_flash_sdpa(tracker, notes) if mapped else _null()):
        q = torch.randn(1, heads, s, d_qk, dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(1, kv_heads, s, d_qk, dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(1, kv_heads, s, d_v, dtype=torch.bfloat16, requires_grad=True)
        mask = torch.ones(s, s, dtype=torch.bool).tril()[None, None] if masked else None
        oracle.observer = tracker
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=not masked,
                                                               enable_gqa=kv_heads != heads)
        kept = tracker.current_bytes
        assert out.shape == (1, heads, s, d_v)       # the flash op's meta kernel would give the query's head size
        out.sum().backward()
        oracle.observer = None
    return kept, notes


def test_mla_sdpa_keeps_what_cudnn_attention_saves_not_the_math_paths_scores():
    # DeepSeek-V3's shape class (qk 192, value 128) at S = 64, bf16: cuDNN attention on sm90 (sdp_utils.cpp
    # check_cudnn_tensor_shapes). Kept after forward: out [1, 2, 64, 128] bf16 + fp32 logsumexp [1, 2, 64, 1] +
    # philox seed and offset (int64 each).
    out, lse, seeds = 2 * 64 * 128 * 2, 2 * 64 * 4, 2 * 8
    kept, notes = _mla_forward_bytes(64, 192, 128, masked=False)
    assert kept == out + lse + seeds
    assert notes == ["SDPA with value heads of another size (MLA) → CUDA cudnn attention op, in 1 calls"]
    cpu_kept, _ = _mla_forward_bytes(64, 192, 128, masked=False, mapped=False)
    assert cpu_kept >= kept + 2 * 64 * 64 * 4               # the math path keeps at least fp32 [1, 2, 64, 64]


def test_masked_mla_sdpa_also_keeps_the_additive_mask_cudnn_is_given():
    # attention.cpp convert_boolean_attn_mask_cudnn: the bool [1, 1, S, S] mask becomes a bf16 additive one, saved.
    kept, _ = _mla_forward_bytes(64, 192, 128, masked=True)
    assert kept == 2 * 64 * 128 * 2 + 2 * 64 * 4 + 2 * 8 + 64 * 64 * 2


def test_mla_dims_cudnn_refuses_take_memory_efficient_attention():
    # qk 256 / value 128 on cuDNN < 9.22: over the 128 limit and not the 192/128 exception → memory-efficient
    # attention, whose logsumexp is [B, H, S rounded up to 32] fp32 (S = 40 → 64).
    kept, notes = _mla_forward_bytes(40, 256, 128, masked=False)
    assert kept == 2 * 40 * 128 * 2 + 2 * 64 * 4 + 2 * 8
    assert notes == ["SDPA with value heads of another size (MLA) → CUDA efficient attention op, in 1 calls"]


def test_mla_sdpa_with_fewer_key_value_heads_takes_cudnn_attention_unexpanded():
    # MiMo-V2-Flash's shape class: qk 192, value 128, 8 query heads on 2 key/value heads under enable_gqa (cuDNN
    # supports_gqa). Kept: out [1, 8, 64, 128] bf16 + fp32 logsumexp [1, 8, 64, 1] + seed and offset.
    kept, notes = _mla_forward_bytes(64, 192, 128, masked=False, heads=8, kv_heads=2)
    assert kept == 8 * 64 * 128 * 2 + 8 * 64 * 4 + 2 * 8 and len(notes) == 1


def _masked_dropout_kept(s: int, mapped: bool, dropout_p: float = 0.1) -> tuple[int, list[str]]:
    """(bytes live after forward, notes) of one masked SDPA call with dropout, equal head sizes (GPT-2's attention in
    training: attn_pdrop 0.1 on padded rows)."""
    from hpcmem.trace.fakeenv import fake_world
    from hpcmem.trace.kernels import _flash_sdpa

    tracker, notes = StorageTracker(), []
    with fake_world() as (_, oracle), (_flash_sdpa(tracker, notes) if mapped else _null()):
        q, k, v = (torch.randn(1, 2, s, 64, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        mask = torch.ones(s, s, dtype=torch.bool).tril()[None, None]
        oracle.observer = tracker
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
        kept = tracker.current_bytes
        out.sum().backward()
        oracle.observer = None
    return kept, notes


def test_masked_sdpa_with_dropout_keeps_no_scores_on_cuda():
    # The CPU's flash kernel refuses dropout, so a masked call with dropout takes the math path and keeps fp32
    # [1, 2, S, S] scores; CUDA takes cuDNN attention (head size 64 ≤ 128, sm90): out [1, 2, 64, 64] bf16 + fp32
    # logsumexp [1, 2, 64, 1] + philox seed and offset + the bf16 additive mask it is given
    # (attention.cpp convert_boolean_attn_mask_cudnn) — the same as the MLA mapping's masked case, by hand.
    kept, notes = _masked_dropout_kept(64, mapped=True)
    assert kept == 2 * 64 * 64 * 2 + 2 * 64 * 4 + 2 * 8 + 64 * 64 * 2
    assert notes == ["SDPA with a mask and dropout → CUDA cudnn attention op, in 1 calls"]
    cpu_kept, _ = _masked_dropout_kept(64, mapped=False)
    assert cpu_kept >= kept + 2 * 64 * 64 * 4               # the math path keeps at least fp32 [1, 2, 64, 64]
    # without dropout nothing is remapped: the CPU flash kernel takes the mask and keeps CUDA's set
    _, plain = _masked_dropout_kept(64, mapped=True, dropout_p=0.0)
    assert plain == []

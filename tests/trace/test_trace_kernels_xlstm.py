"""xLSTM's mLSTM kernels (hpcmem/trace/kernels_xlstm.py): the configs whose GPU run is the torch chunkwise code the trace
measures, the refusal of the others (at check time and before `learn` traces anything), the cut that keeps the block
count in step, and what that torch code keeps for backward, written out from mlstm_kernels' chunkwise/native/fw.py
(github.com/NX-AI/mlstm_kernels @39d3c61)."""

from __future__ import annotations

import pytest

from hpcmem.errors import SpecError
from hpcmem.job.kernel_limits import xlstm_problems


def test_the_class_defaults_are_the_traced_kernels_and_other_types_pass():
    assert xlstm_problems("xlstm", {}) == []
    assert xlstm_problems("xlstm", {"chunkwise_kernel": "chunkwise--native_autograd",
                                     "sequence_kernel": "native_sequence__native", "mode": "train"}) == []
    assert xlstm_problems("llama", {"chunkwise_kernel": "chunkwise--triton_xl_chunk"}) == []


def test_a_triton_kernel_config_is_refused_naming_field_and_value():
    got = xlstm_problems("xlstm", {"chunkwise_kernel": "chunkwise--triton_xl_chunk",
                                    "sequence_kernel": "native_sequence__triton"})
    assert len(got) == 2
    assert got[0].startswith("chunkwise_kernel 'chunkwise--triton_xl_chunk'") and "chunkwise--native_autograd" in got[0]
    assert got[1].startswith("sequence_kernel 'native_sequence__triton'")


def test_learn_refuses_a_triton_config_before_tracing():
    pytest.importorskip("torch")
    from hpcmem.trace.learn import learn

    cfg = {"model_type": "xlstm", "hidden_size": 64, "num_hidden_layers": 2, "num_heads": 2, "vocab_size": 512,
           "chunkwise_kernel": "chunkwise--triton_limit_chunk"}
    with pytest.raises(SpecError, match="chunkwise_kernel 'chunkwise--triton_limit_chunk'"):
        learn(cfg, "tiny-xlstm", workers=1)


@pytest.mark.torch
def test_a_cut_builds_as_many_blocks_as_it_says():
    pytest.importorskip("transformers")
    from hpcmem.trace import layer_map as lay

    cfg = {"model_type": "xlstm", "hidden_size": 64, "num_hidden_layers": 6, "num_blocks": 6, "num_heads": 2,
           "vocab_size": 512}
    small = lay.reduced_config(cfg, "num_hidden_layers", 3, 6)
    assert small["num_blocks"] == 3
    assert len(lay.layout(small).layer_kinds) == 3       # xLSTMModel builds num_blocks blocks


@pytest.mark.torch
def test_the_torch_chunkwise_kernel_keeps_every_chunk_boundary_state():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import transformers.models.xlstm.modeling_xlstm as xlstm

    from hpcmem.trace.fakeenv import fake_world
    from hpcmem.trace.tracker import StorageTracker

    b, nh, s, dqk, dhv, chunk = 1, 1, 192, 4, 8, 64          # 3 chunks; fp32 (4 bytes)
    nc = s // chunk
    tracker = StorageTracker()
    with fake_world() as (_, oracle):
        oracle.observer = tracker

        def leaf(*shape):
            return torch.randn(*shape, dtype=torch.float32, requires_grad=True)

        q, k, v, i, f = leaf(b, nh, s, dqk), leaf(b, nh, s, dqk), leaf(b, nh, s, dhv), leaf(b, nh, s), leaf(b, nh, s)
        before = set(tracker._live)
        h = xlstm.mlstm_chunkwise_native_autograd(q, k, v, i, f, chunk_size=chunk)
        born = sorted(entry[1] for key, entry in tracker._live.items() if key not in before)
        h.sum().backward()
        assert q.grad.shape == q.shape and f.grad.shape == f.shape
        oracle.observer = None
    # mlstm_chunkwise__recurrent_fw_C allocates the boundary states of all NC + 1 chunks, matC_states
    # [B, NH, (NC + 1)·DHQK, DHHV] and vecN_states [B, NH, (NC + 1)·DHQK]; parallel_fw_H's matmuls with their first NC
    # blocks (matQ_chunk_gated @ matC_k_states, @ vecN_k_states) save views of them, so both stay alive to backward
    assert born.count((nc + 1) * dqk * dhv * 4) == 1
    assert born.count((nc + 1) * dqk * 4) == 1
    # and the chunk loop's C_k of every chunk ([B, NH, DHQK, DHHV] each: the initial zeros and NC − 1 updates, each
    # saved by the next chunk's scaGbar_k * matC_k; the last update is dropped with the unused last states)
    assert born.count(dqk * dhv * 4) == nc

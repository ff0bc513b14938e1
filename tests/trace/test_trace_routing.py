"""The value oracle's assumed routing: a transformers expert loop that indexes the experts the router hit runs in the
fake world exactly as the same module runs on real tensors routed by hand, and MoE code that never reads the routing
is left alone."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

pytestmark = pytest.mark.torch


class _IndexShapes(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the shape of every `aten.index.Tensor` output: the rows each expert gathers."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten.index.Tensor:
            self.shapes.append(tuple(out.shape))
        return out


def _hand_routing(tokens: int, k: int, experts: int) -> list[list[int]]:
    """Token t takes experts t·k, t·k + 1, …, t·k + k − 1 round the ring of experts (by hand, not the code)."""
    rows, e = [], 0
    for _ in range(tokens):
        row = []
        for _ in range(k):
            row.append(e)
            e = (e + 1) % experts
        rows.append(row)
    return rows


def test_balanced_routing_by_hand():
    from hpcmem.trace.oracle import balanced_routing

    assert balanced_routing(4, 2, 4).tolist() == [[0, 1], [2, 3], [0, 1], [2, 3]]
    assert balanced_routing(5, 3, 7).tolist() == _hand_routing(5, 3, 7)
    counts = torch.bincount(balanced_routing(24, 3, 8).flatten(), minlength=8)
    assert counts.tolist() == [9] * 8          # 24 tokens × 3 slots over 8 experts


def _dbrx_ffn():
    from transformers import DbrxConfig
    from transformers.models.dbrx.modeling_dbrx import DbrxFFN

    cfg = DbrxConfig(d_model=32, n_heads=2, n_layers=1,
                     ffn_config={"ffn_hidden_size": 16, "moe_num_experts": 4, "moe_top_k": 2})
    return DbrxFFN(cfg)


def test_dbrx_expert_loop_runs_as_the_real_one_routed_by_hand():
    """DBRX's experts (modeling_dbrx.py DbrxExperts.forward: one_hot → nonzero → torch.where per expert) in the fake
    world gather the same rows, expert by expert, as the real module given the hand-made balanced routing."""
    from hpcmem.trace.fakeenv import fake_world

    tokens, k = 12, 2
    real = _dbrx_ffn()
    index = torch.tensor(_hand_routing(tokens, k, 4))
    weights = torch.full((tokens, k), 0.5)
    with _IndexShapes() as seen_real:
        real.experts(torch.randn(tokens, 32), index, weights)

    with fake_world() as (_, oracle):
        ffn = _dbrx_ffn()
        x = torch.randn(1, tokens, 32, requires_grad=True)
        with _IndexShapes() as seen_fake:
            y = ffn(x)
        y.sum().backward()
        assert x.grad.shape == x.shape
    assert seen_fake.shapes == seen_real.shapes
    assert (tokens * k // 4, 32) in seen_fake.shapes        # 6 rows per expert
    assert oracle.routing_reads["aten.nonzero.default"] >= 1


def test_longcat_routing_mask_above_the_known_limit():
    """LongCat-Flash's experts (modeling_longcat_flash.py LongcatFlashExperts.forward) with zero-compute experts:
    the one-hot routing mask is above the oracle's limit for real copies and is still known, because it is computed
    from the assumed routing (the LongCat config at tiny widths; 8 routed + 4 identity experts, top 3)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from transformers import LongcatFlashConfig
    from transformers.models.longcat_flash.modeling_longcat_flash import LongcatFlashExperts, LongcatFlashMoE

    cfg = LongcatFlashConfig(hidden_size=16, expert_ffn_hidden_size=8, n_routed_experts=8, zero_expert_num=4,
                             moe_topk=3, num_layers=1, num_attention_heads=2, num_key_value_heads=2)
    tokens = 16
    real = LongcatFlashExperts(cfg)
    with _IndexShapes() as seen_real:
        real(torch.randn(tokens, 16), torch.tensor(_hand_routing(tokens, 3, 12)), torch.ones(tokens, 3))

    from hpcmem.trace.oracle import make_oracle

    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    oracle = make_oracle(fake_mode, max_known_numel=100)     # the mask is 16 × 3 × 12 = 576 elements
    with fake_mode, oracle:
        moe = LongcatFlashMoE(cfg)
        with _IndexShapes() as seen_fake:
            moe(torch.randn(1, tokens, 16))
    assert seen_fake.shapes == seen_real.shapes
    assert oracle.routing_reads["item"] >= 12                  # every expert's index read to Python


def test_grouped_mm_experts_never_read_the_routing():
    """Qwen3-MoE's experts (transformers' grouped_mm implementation) compute on the routing without reading it: the
    assumption is never read, so the fake run is the one it was without the rule."""
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    from hpcmem.trace.fakeenv import fake_world

    cfg = Qwen3MoeConfig(hidden_size=32, moe_intermediate_size=16, num_experts=8, num_experts_per_tok=2)
    cfg._experts_implementation = "grouped_mm"       # what from_pretrained / from_config set by default
    with fake_world() as (_, oracle):
        block = Qwen3MoeSparseMoeBlock(cfg).to(torch.bfloat16)
        x = torch.randn(1, 12, 32, dtype=torch.bfloat16, requires_grad=True)
        block(x).sum().backward()
    assert not oracle.routing_reads

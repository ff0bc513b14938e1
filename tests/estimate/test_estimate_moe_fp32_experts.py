"""The routed experts of an fp32 MoE under bf16 autocast compute in fp32: torch's grouped matmul has no autocast
kernel (torch 2.13's dispatch table lists no Autocast key for aten::_grouped_mm, where aten::mm has AutocastCUDA and
AutocastCPU), so transformers' `grouped_mm_experts_forward` runs in the stacks' and the residual stream's dtype and
its routed tensors — the routed copy of the hidden states, gate_up's output, the activation, the product, the
experts' output — are fp32 (hpcmem.estimate.activations `expert_bytes`).

Known answers: torch's own dispatch table, and the trace of random job s6-55 (qwen2_moe, derived; GRPO full
fine-tuning without checkpointing, fp32 weights, bf16, 6 completions × (1,232 + 132) tokens; its job stored in
tests/fixtures/random/), whose peak is the fused LM head's backward with every layer's routed tensors saved; the
estimate read −5.4 % with them in bf16."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from tests.helpers.trace_helpers import assert_within, stored_random_job, traced_and_estimated  # noqa: E402

pytestmark = pytest.mark.torch


def test_grouped_mm_has_no_autocast_kernel():
    import torch

    def autocast_keys(op: str) -> set[str]:
        return {line.split(":")[0].strip() for line in torch._C._dispatch_dump(op).splitlines() if "Autocast" in line}

    assert "AutocastCUDA" in autocast_keys("aten::mm")
    assert not autocast_keys("aten::_grouped_mm")


def test_an_fp32_moe_under_autocast_is_within_3_pct_of_its_trace():
    from hpcmem.estimate.activations import expert_bytes
    from hpcmem.job.shape import precision

    spec = stored_random_job("s6-55-qwen2-moe-grpo-fp32-experts.json")
    prec = precision(spec)
    assert spec.model.is_moe and prec.autocast and expert_bytes(prec) == 4 and prec.act == 2
    traced, _, peak = traced_and_estimated(spec)
    assert "lm head" in traced.phase, traced.phase
    assert_within(peak, traced.peak_allocated_bytes, 0.03)

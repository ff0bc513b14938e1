"""Full fine-tuning of an MoE type with fused experts, fp32 weights under bf16 autocast, 4 micro-batches.

Two mechanisms the estimate once took from dense layers:
- autocast caches 16-bit copies only of leaf weights a lower-precision op casts; transformers' experts index the
  fused stacks or pass them to grouped_mm with the input cast to the weights' dtype (integrations/moe.py), so the
  stacks are never cast or cached (hpcmem.estimate.states `autocast_cached`);
- under gradient accumulation AccumulateGrad adds each new weight gradient into .grad and frees it, so an MoE layer's
  backward holds one expert stack's new gradient at a time, not the layer's (hpcmem.estimate.step), and the smaller
  stacks' freed blocks stay cached beside it (hpcmem.estimate.allocator `accumulated_stacks`).

Known answer: the trace of random job s2-173 (Mixtral SFT, 3 layers at full width, fp32, bf16 on, wrapped packing,
1 × 333 tokens, 4 micro-batches; its job stored as tests/fixtures/random/) and the caching-allocator model replaying
its device stream. The estimate read it +6.5 % on allocated (the autocast cache and the whole layer's gradients) and
+3.1 % on reserved."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("trl")

from tests.helpers.trace_helpers import ROOT, assert_within  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.mark.slow
def test_an_accumulating_fp32_moe_job_is_within_3_pct_of_its_trace_on_both_peaks():
    from hpcmem.validate.random_trace import score, trace_record

    job = json.loads((ROOT / "tests" / "fixtures" / "random" / "s2-173-mixtral-fp32-accumulation.json").read_text())
    assert job["settings"]["gradient_accumulation_steps"] > 1 and job["settings"]["dtype"] == "float32"
    rec = trace_record(job)
    assert "trace" in rec, rec
    s = score(rec)
    assert abs(s["err_pct"]) <= 3.0, s
    assert abs(s["reserved_err_pct"]) <= 3.0, s


def test_mixtral_s_autocast_cache_and_gradient_sizes_by_hand():
    """Mixtral-8x7B (H 4096, 32 heads of 128, 8 kv heads, I 14336, 8 experts): autocast caches q, k, v, o and the
    bare-weight router, not the fused [8, 2·14336, 4096] gate_up and [8, 4096, 14336] down stacks."""
    from hpcmem.estimate.states import param_parts
    from hpcmem.models import resolve_model

    parts = param_parts(resolve_model("mistralai/Mixtral-8x7B-v0.1"))
    h, kv, i, e = 4096, 8 * 128, 14336, 8
    assert parts.autocast_cached_per_layer == 2 * h * h + 2 * h * kv + h * e
    assert parts.autocast_cached == 32 * (2 * h * h + 2 * h * kv + h * e)
    assert parts.largest_moe_tensor == e * 2 * i * h
    assert parts.largest_attention_tensor == h * h
    assert parts.moe_stack_rest == e * h * i
    assert parts.moe_down_stack == e * i * h            # the [8, 4096, 14336] down stack: its output is H


@pytest.mark.slow
def test_the_first_expert_gradient_is_written_with_the_whole_recompute_alive():
    """Random job s3-32 (Mixtral distillation, fp32 weights without autocast, 4 × (5,315 + 93) tokens, 4 micro-batches;
    its job stored in tests/fixtures/random/): the trace's peak is the down stack's new gradient (the backward's first
    expert gradient) beside every tensor the recompute saved; the larger gate_up stack's comes after the activation's
    saved tensors are freed. The estimate, which paired the largest stack's gradient with the whole recompute, read
    it +4.5 %."""
    from tests.helpers.trace_helpers import stored_random_job, traced_and_estimated

    spec = stored_random_job("s3-32-mixtral-distillation-accumulation.json")
    assert spec.train.gradient_accumulation_steps > 1 and spec.model.is_moe
    traced, _, peak = traced_and_estimated(spec)
    assert_within(peak, traced.peak_allocated_bytes, 0.03)

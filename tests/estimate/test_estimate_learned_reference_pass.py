"""A learned model's reference pass (DPO, KTO): its widest layer instant is the traced one — the checkpointed
full-fine-tuning cell's forward peak, since a checkpointed layer's forward keeps nothing for backward, as a no-grad
pass does (hpcmem.estimate.learned `no_grad_layer_peak`) — not the gated-MLP formulas of a derived type, which miss
MLA's expanded keys and the attention's instants.

Known answer: the trace of random job s2-235 (GLM-4.7-Flash-style `glm4_moe_lite`, learned; DPO full fine-tuning
without checkpointing, 2 × 12,136 tokens, 3 micro-batches; its job stored in tests/fixtures/random/), whose peak is the
reference forward's layer 2 in the second micro-batch; the estimate read −3.4 % with the formulas' instant."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from tests.helpers.trace_helpers import assert_within, stored_random_job, traced_and_estimated  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.mark.slow
def test_a_learned_reference_pass_is_within_3_pct_of_its_trace():
    spec = stored_random_job("s2-235-glm4-moe-lite-dpo-reference.json")
    assert spec.model.learned is not None and spec.train.trainer == "dpo"
    traced, est, peak = traced_and_estimated(spec)
    assert "reference forward / layer" in traced.phase, traced.phase
    assert_within(peak, traced.peak_allocated_bytes, 0.03)


def test_the_traced_instant_is_the_checkpointed_full_cell_s_forward_peak():
    """By hand from the profile's stored polynomials: the largest fpeak over the layers the model maps, at the pass's
    tokens and padded rows."""
    from hpcmem.estimate.learned import no_grad_layer_peak
    from hpcmem.job.shape import Precision

    spec = stored_random_job("s2-235-glm4-moe-lite-dpo-reference.json")
    p = spec.model.learned
    cell = p.cell("w2a2", "full", True)
    rows, seq = 4, 1000
    poly = [cell.fpeak[r] for r in set(p.layer_map)]
    by_hand = max(t.at(rows * seq, rows * seq * seq) for t in poly)
    bf16 = Precision(weight=2, act=2, residual=2, autocast=False)
    assert no_grad_layer_peak(spec, rows, seq, bf16) == by_hand > 0
    assert no_grad_layer_peak(spec, rows, seq, Precision(weight=4, act=2, residual=4, autocast=True)) is None

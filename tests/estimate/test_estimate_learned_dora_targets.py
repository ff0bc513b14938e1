"""DoRA on a learned type, on other linears than the DoRA cell's reference (all-linear, r 16): the cell's backward peak
can be the reference's DoRA instant (the recompute's weight-norm copies of its widest linear), which a user's DoRA on
fewer or narrower linears does not reach. The estimate takes the larger of the user's DoRA instant (the reference's
shifted by the difference of their forward transients) and the cell's backward instants (bounded below by the
plain LoRA cell with DoRA's own terms, above by the DoRA cell's peak) — hpcmem.estimate.learned `layer_bytes`.

Known answer: the trace of random job s1-427 (Gemma DPO, DoRA on gate_proj and o_proj, r 64, one row pair of 744
tokens; its job stored as tests/fixtures/random/), which the estimate read +60 % over while it kept the reference's
DoRA instant; now +8 % (DoRA's difference formulas over the reference adapters; the job stays "not held").
"""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from tests.helpers.trace_helpers import stored_random_job, traced_and_estimated  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.mark.slow
def test_dora_on_two_linears_of_a_learned_type_does_not_keep_the_references_dora_instant():
    spec = stored_random_job("s1-427-gemma-dora-two-targets.json")
    assert spec.model.learned is not None and spec.train.use_dora
    assert set(spec.train.lora_target_modules) == {"gate_proj", "o_proj"}
    traced, _, peak = traced_and_estimated(spec)
    assert traced.peak_allocated_bytes <= peak <= 1.10 * traced.peak_allocated_bytes, \
        (peak, traced.peak_allocated_bytes)

"""Under checkpointing a learned layer's `kept` term that grows with rows·seq² is the causal mask every layer of its
kind takes as an input; it dies once, with the lowest such layer's backward, however many real layers of the kind
map onto that traced layer (hpcmem.estimate.learned `shared_once_quad`).

Known answers: the stored traces of two random jobs whose cuts repeat a masked kind past the learned depth
(estimator/random/trace.jsonl, the real TRL/transformers code on fake tensors). s6-4: LFM2, 12 layers with attention
at 2, 5, 8 and 10, SFT full fine-tuning with checkpointing, 8 × 36,420 tokens: the trace holds one
[8, 1, 36,420, 36,420] boolean mask (9.88 GiB, by hand: 8 · 36,420² B); counting one per attention layer up to the
peak's layer 10 put three more in (+28.5 %). s5-28: Lara-mini, sliding layers at 1 and 4, 4 × 94,031 tokens: one
sliding mask more (4 · 94,031² B = 32.9 GiB, +17.8 %)."""

from __future__ import annotations

import pytest

from tests.helpers.random_records import stored_trace_record


@pytest.mark.torch
@pytest.mark.parametrize("job_id", ["s6-4", "s5-28"])
def test_one_mask_per_masked_kind_within_one_percent_of_the_trace(job_id: str) -> None:
    from hpcmem.validate.random_jobs import RandomJob
    from hpcmem.validate.random_model import job_spec
    from hpcmem.validate.random_trace import as_traced

    rec = stored_trace_record(job_id)
    est, _ = as_traced(job_spec(RandomJob.from_dict(rec["job"])))
    traced = rec["trace"]["peak_allocated_bytes"]
    assert abs(est.peak_allocated_bytes - traced) / traced < 0.01


def test_the_masks_by_hand() -> None:
    assert 8 * 36_420**2 / 2**30 == pytest.approx(9.88, abs=0.01)
    assert 4 * 94_031**2 / 2**30 == pytest.approx(32.94, abs=0.01)

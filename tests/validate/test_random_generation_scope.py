"""A generating trainer's random job is scored over the instants its trace runs: the trace replaces generation
(hpcmem.trace.rl), so the estimate's generation instants are left out of the compared peak and reserved.

Expected values: the stored traces of the real TRL code (estimator/random/trace.jsonl, `hpcmem validate random
--oracle trace`), whose peak is in the backward; the estimate's own peak of those jobs is a generation instant."""

from __future__ import annotations

import pytest

from hpcmem.estimate import estimate
from hpcmem.validate.random_jobs import RandomJob
from hpcmem.validate.random_model import job_spec
from hpcmem.validate.random_trace import score
from tests.helpers.random_records import stored_trace_record

# GRPO ministral3 LoRA GC, GRPO minicpm3 LoRA GC: traced peak in "step 2 / backward / layer 2"
JOBS = ("s1-220", "s1-696")


@pytest.mark.parametrize("job_id", JOBS)
def test_generation_instants_are_not_scored_against_a_trace_without_generation(job_id: str) -> None:
    rec = stored_trace_record(job_id)
    assert "backward" in rec["trace"]["phase"]
    full = estimate(job_spec(RandomJob.from_dict(rec["job"])))
    assert full.peak_phase.name.startswith("generation")          # the instant the trace never ran
    s = score(rec)
    assert s["estimate"]["unscored"] == ["generation (prefill)", "generation (last token)"]
    assert s["estimate"]["phase"].startswith("backward")
    assert abs(s["err_pct"]) <= 3.0 and abs(s["reserved_err_pct"]) <= 3.0, s


def test_a_trainer_that_does_not_generate_leaves_nothing_out() -> None:
    rec = stored_trace_record("s1-211")                                       # KTO: no generation
    assert score(rec)["estimate"]["unscored"] == []

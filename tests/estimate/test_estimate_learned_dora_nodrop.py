"""DoRA without LoRA dropout on a learned type — lora_dropout 0, or TRL's disable_dropout in DPO, KTO and Reward —
takes the cells traced so (`dora-nodrop`: hpcmem.estimate.learned `dora_nodrop_cell`), not the DoRA cell traced at
dropout 0.05 with the dropout's difference by the formulas.

Known answers: traces of random jobs (the real TRL trainers on fake tensors at full width). s1-154 and s8-229 are of
estimator/random/trace.jsonl (drawn before the cells: +4.21 and +3.19 % from the DoRA cell); the others were drawn
after them from a fresh seed for this change (`python -m hpcmem.lab.random_touched dora-nodrop --seed 21`,
estimator/random/touched/dora-nodrop.jsonl): +5.79, +3.63 and +2.19 %."""

from __future__ import annotations

import dataclasses

import pytest

from tests.helpers.random_records import allocated_error_pct as _error_pct
from tests.helpers.random_records import record_spec as _spec
from tests.helpers.random_records import scored_estimate as _scored
from tests.helpers.random_records import stored_trace_record, without_cells
from tests.helpers.sweep_profiles import sweep_spec

pytestmark = pytest.mark.torch

TOUCHED = "touched/dora-nodrop.jsonl"
# SFT DoRA all-linear on MiniCPM3, GRPO on StableLM; KTO on MiniCPM3, DPO on Cohere, RLOO on Cohere2
MOVED = [("s1-154", "trace.jsonl", 4.21), ("s8-229", "trace.jsonl", 3.19), ("s21-2665", TOUCHED, 5.79),
         ("s21-2334", TOUCHED, 3.63), ("s21-1254", TOUCHED, 2.19)]


@pytest.mark.parametrize(("job_id", "records", "before"), MOVED)
def test_dora_without_dropout_takes_its_cell(job_id: str, records: str, before: float) -> None:
    from hpcmem.estimate.learned import learned_cell
    from hpcmem.estimate.lora import lora_dropout_active, lora_layout
    from hpcmem.job.shape import micro_batch, precision

    rec = stored_trace_record(job_id, records)
    spec = _spec(rec)
    assert spec.train.use_dora and not lora_dropout_active(spec.train)
    cell, ref = learned_cell(spec, precision(spec), lora_layout(spec), micro_batch(spec))
    assert cell is spec.model.learned.cells["w2a2/dora-nodrop/gc"] and ref["lora_dropout"] == 0.0
    assert abs(_error_pct(spec, rec)) < 0.6
    assert not any("not held" in w for w in _scored(spec).warnings)
    # the profile without it: the DoRA cell with the dropout's difference, said not held
    old = without_cells(spec, "/dora-nodrop/")
    assert _error_pct(old, rec) == pytest.approx(before, abs=0.01)
    assert any("traced with dropout 0.05" in w for w in _scored(old).warnings)


def test_the_learner_traces_dora_at_dropout_0_on_the_reference_adapters() -> None:
    from hpcmem.trace.learn import learn_job, missing_cells

    p, spec = sweep_spec("stablelm")
    job, dora = (learn_job(spec, "bfloat16", t, True, 512) for t in ("dora-nodrop", "dora"))
    assert job.train.use_dora and job.train.lora_dropout == 0.0
    assert dataclasses.replace(job.train, lora_dropout=dora.train.lora_dropout) == dora.train
    bare = dataclasses.replace(p, cells={k: c for k, c in p.cells.items() if "/dora-nodrop/" not in k})
    assert ("dora-nodrop", True) in missing_cells(bare) and ("dora-nodrop", True) not in missing_cells(p)

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

from tests.helpers.random_records import stored_trace_record

pytestmark = pytest.mark.torch

TOUCHED = "touched/dora-nodrop.jsonl"
# SFT DoRA all-linear on MiniCPM3, GRPO on StableLM; KTO on MiniCPM3, DPO on Cohere, RLOO on Cohere2
MOVED = [("s1-154", "trace.jsonl", 4.21), ("s8-229", "trace.jsonl", 3.19), ("s21-2665", TOUCHED, 5.79),
         ("s21-2334", TOUCHED, 3.63), ("s21-1254", TOUCHED, 2.19)]


def _spec(rec: dict):
    from hpcmem.validate.random_jobs import RandomJob
    from hpcmem.validate.random_model import job_spec

    return job_spec(RandomJob.from_dict(rec["job"]))


def _scored(spec):
    from hpcmem.validate.random_trace import as_traced, scored_as_traced

    return as_traced(scored_as_traced(spec))[0]


def _error_pct(spec, rec: dict) -> float:
    from hpcmem.estimate.workspaces import tensor_bytes

    traced = rec["trace"]["peak_allocated_bytes"]
    return 100.0 * (max(tensor_bytes(p) for p in _scored(spec).phases) - traced) / traced


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
    p = spec.model.learned
    old = dataclasses.replace(spec, model=dataclasses.replace(spec.model, learned=dataclasses.replace(
        p, cells={k: c for k, c in p.cells.items() if "/dora-nodrop/" not in k})))
    assert _error_pct(old, rec) == pytest.approx(before, abs=0.01)
    assert any("traced with dropout 0.05" in w for w in _scored(old).warnings)


def test_the_learner_traces_dora_at_dropout_0_on_the_reference_adapters() -> None:
    import json

    from hpcmem.datapath import estimator_dir
    from hpcmem.models.profile import profile_from_dict, spec_from_profile
    from hpcmem.trace.learn import learn_job, missing_cells

    p = profile_from_dict(json.loads((estimator_dir() / "coverage-profiles" / "stablelm.json").read_text()))
    job = learn_job(spec_from_profile(p, p.model_type), "bfloat16", "dora-nodrop", True, 512)
    dora = learn_job(spec_from_profile(p, p.model_type), "bfloat16", "dora", True, 512)
    assert job.train.use_dora and job.train.lora_dropout == 0.0
    assert dataclasses.replace(job.train, lora_dropout=dora.train.lora_dropout) == dora.train
    bare = dataclasses.replace(p, cells={k: c for k, c in p.cells.items() if "/dora-nodrop/" not in k})
    assert ("dora-nodrop", True) in missing_cells(bare) and ("dora-nodrop", True) not in missing_cells(p)

"""DoRA with reentrant checkpointing on a learned type: the DoRA cells' reentrant variants (`dora-reentrant`,
`dora-nodrop-reentrant`: hpcmem.estimate.learned `learned_cell`), not the non-reentrant DoRA cells with a "not held"
warning. torch's reentrant checkpoint runs the layer's forward under no_grad and its whole recompute in the backward
(torch/utils/checkpoint.py CheckpointFunction), and DoRA's weight norms and products sit in that recompute: another set
of tensors per layer than the non-reentrant one's. PEFT under ZeRO-3 forces reentrant checkpointing (TRL), so DoRA
there meets it.

Known answers: traces of random jobs (the real TRL trainers on fake tensors at full width). s1-54 is of
estimator/random/trace.jsonl (in sample: it showed it, +4.36 %); touched/dora-reentrant.jsonl holds the DoRA jobs with
reentrant checkpointing among seed 27's first 8,000 draws (`python -m hpcmem.lab.random_touched dora-reentrant --seed
27`), traced before the cells were learned."""

from __future__ import annotations

import dataclasses
import json

import pytest

from tests.helpers.random_records import allocated_error_pct, record_spec, stored_trace_record, without_cells
from tests.helpers.sweep_profiles import sweep_profile, sweep_spec

pytestmark = pytest.mark.torch

# s1-54 from the dora-nodrop-reentrant cell: +2.81 % (+4.36 % from the non-reentrant DoRA cell)
BOUND_S1_54 = 3.0
# seed 27's DoRA jobs with reentrant checkpointing whose profiles have the cells (every one scored): (jobs, within 3 %
# from the non-reentrant DoRA cells, within 3 % from the reentrant ones). Beyond 3 % now: LFM3 and Nemotron-H (DoRA on
# a subset of the reference's targets, −4.10 → +4.21 and −5.95 → −6.83 %), OLMo-Hybrid (+5.55 → +4.80), GPT-BigCode
# (+5.72 both), GPT-Neo (+0.66 → +3.75) and Falcon (−22.84 → −26.52 %: its FalconLinear under DoRA, not located)
DRAWN = (25, 18, 19)


def test_the_cells_trace_dora_reentrantly_and_are_offered() -> None:
    from hpcmem.trace.learn import learn_job, missing_cells

    _, spec = sweep_spec("stablelm")
    for technique, dropout in (("dora-reentrant", 0.05), ("dora-nodrop-reentrant", 0.0)):
        job = learn_job(spec, "bfloat16", technique, True, 512)
        assert job.train.use_dora and job.train.lora_dropout == dropout
        assert job.train.gradient_checkpointing_kwargs == {"use_reentrant": True}
    p = sweep_profile("stablelm")
    bare = dataclasses.replace(p, cells={k: c for k, c in p.cells.items() if not k.startswith("w2a2/dora-")
                                         or not k.endswith("-reentrant/gc")})
    assert {("dora-reentrant", True), ("dora-nodrop-reentrant", True)} <= set(missing_cells(bare))
    assert not {("dora-reentrant", True), ("dora-nodrop-reentrant", True)} & set(missing_cells(p))


def test_the_job_that_showed_it() -> None:
    """s1-54: nanochat KTO, DoRA at lora_dropout 0 on fc1 and k_proj, reentrant: the dora-nodrop-reentrant cell."""
    from hpcmem.estimate.learned import learned_cell
    from hpcmem.estimate.lora import lora_layout
    from hpcmem.job.shape import micro_batch, precision
    from tests.helpers.random_records import scored_estimate

    rec = stored_trace_record("s1-54")
    spec = record_spec(rec)
    cell, _ = learned_cell(spec, precision(spec), lora_layout(spec), micro_batch(spec))
    assert cell is spec.model.learned.cells["w2a2/dora-nodrop-reentrant/gc"]
    assert not any("reentrant" in w and "not held" in w for w in scored_estimate(spec).warnings)
    old = without_cells(spec, "-reentrant/")
    assert allocated_error_pct(old, rec) == pytest.approx(4.36, abs=0.01)
    assert abs(allocated_error_pct(spec, rec)) < BOUND_S1_54


def test_jobs_drawn_before_the_cells() -> None:
    """Seed 27's DoRA jobs with reentrant checkpointing whose profile has the cells: allocated within 3 % from the
    non-reentrant DoRA cells and from the reentrant ones (`DRAWN`)."""
    from hpcmem.datapath import estimator_dir

    path = estimator_dir() / "random" / "touched" / "dora-reentrant.jsonl"
    recs = [r for r in (json.loads(line) for line in path.read_text().splitlines())
            if (r.get("trace") or {}).get("peak_allocated_bytes")]
    got = {}
    for r in recs:
        spec = record_spec(r)
        if not any(k.endswith("-reentrant/gc") and "/dora" in k for k in spec.model.learned.cells):
            continue
        got[r["id"]] = (allocated_error_pct(without_cells(spec, "-reentrant/"), r), allocated_error_pct(spec, r))
    within = [sum(abs(e[i]) <= 3 for e in got.values()) for i in (0, 1)]
    assert (len(got), *within) == DRAWN, got

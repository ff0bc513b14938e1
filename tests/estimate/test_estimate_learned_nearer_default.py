"""LoRA on targets nearer peft's default ones than the reference's, on a learned type whose profile traced both: the
estimate starts from the default targets' cell (`lora-default`, `lora-default-nodrop`: hpcmem.estimate.learned
`nearer_default_cell`) and takes the difference formulas for the fewer adapters that differ. From the reference's
cell (all-linear) the formulas take every other adapter away at that cell's peak instant — the MLP's backward — whether
or not their tensors are alive there. A job whose extra adapters (beyond the default's) touch the MLP's wide linears
(up, gate, down: `widest_leaves`) or a layer kind the default adapts nothing in (`beside_leaves`: Nemotron-H's Mamba
in_proj) keeps the reference's cell, whose peak instants hold them.

Known answers: traces of random jobs (the real TRL trainers on fake tensors at full width). s8-343 and s1-526 are of
estimator/random/trace.jsonl, in-sample (they showed it: +6.04 and -4.69 %). touched/nearer-default.jsonl (seed 23)
and touched/nearer-default-24.jsonl hold the jobs a first rule touched (`python -m hpcmem.lab.random_touched
nearer-default --seed 23`): counting linears alone it read jobs with extra MLP adapters further off (OPT on fc1 and
v_proj +1.37 → −7.86 %, StableLM on q/k/v/up_proj +2.87 → −3.08 %), so the MLP clause was chosen on both seeds;
seed 25 (touched/nearer-default-25.jsonl) then read Nemotron-H on in_proj and v_proj +0.03 → +3.56 %, and the
layer-kind clause was chosen on it. touched/nearer-default-26.jsonl was drawn after both from a fresh seed."""

from __future__ import annotations

import dataclasses
import json

import pytest

from tests.helpers.random_records import allocated_error_pct, record_spec, stored_trace_record

pytestmark = pytest.mark.torch

IN_SAMPLE = [("s8-343", 6.04), ("s1-526", -4.69)]


def _taken(spec):
    from hpcmem.estimate.learned import learned_cell
    from hpcmem.estimate.lora import lora_layout
    from hpcmem.job.shape import micro_batch, precision

    return learned_cell(spec, precision(spec), lora_layout(spec), micro_batch(spec))


@pytest.mark.parametrize(("job_id", "before"), IN_SAMPLE)
def test_the_jobs_that_showed_it_take_the_default_cell(monkeypatch, job_id: str, before: float) -> None:
    import hpcmem.estimate.learned as learned

    rec = stored_trace_record(job_id)
    spec = record_spec(rec)
    cell, ref = _taken(spec)
    default = spec.model.learned.provenance["lora_default"]
    assert ref["lora_target_modules"] == default["lora_target_modules"]
    assert cell is spec.model.learned.cells["w2a2/lora-default/gc"]
    assert abs(allocated_error_pct(spec, rec)) < 1.5
    monkeypatch.setattr(learned, "nearer_default_cell", lambda *a, **k: None)
    assert allocated_error_pct(spec, rec) == pytest.approx(before, abs=0.01)


def test_a_mamba_mixer_adapter_keeps_the_reference_cell() -> None:
    """Nemotron-H's default targets are attention projections; its Mamba layers' in_proj is in a layer kind where the
    default adapts nothing, so a job adapting it keeps the all-linear cell — as one on q/k/o_proj does not."""
    from hpcmem.estimate.learned import nearer_default_cell
    from hpcmem.estimate.lora import lora_layout
    from hpcmem.job.shape import precision

    spec = record_spec(stored_trace_record("s1-526"))
    for targets, default in ((("q_proj", "k_proj", "o_proj"), True), (("in_proj", "v_proj"), False)):
        job = dataclasses.replace(spec, train=dataclasses.replace(spec.train, lora_target_modules=targets))
        assert (nearer_default_cell(job, precision(job), lora_layout(job)) is not None) is default, targets


@pytest.mark.parametrize(("targets", "default"), [
    (("k_proj", "v_proj"), True),                   # 2 differ from q/v, 5 from all-linear
    (("k_proj", "o_proj", "q_proj"), True),         # 2 and 4
    (("gate_proj", "o_proj", "v_proj"), False),     # 3 and 4, but an MLP linear the default lacks
    (("down_proj", "v_proj"), False),               # 2 and 5, but an MLP linear the default lacks
    (("q_proj", "v_proj"), False),                  # the default itself: its own cell (`default_cell`)
    (("q_proj", "k_proj", "v_proj", "o_proj", "up_proj"), False),   # 3 and 2
])
def test_which_cell_a_stablelm_job_starts_from(targets: tuple[str, ...], default: bool) -> None:
    """StableLM's reference is all-linear (q/k/v/o_proj, gate/up/down_proj), its default q_proj and v_proj; the rule
    counts the linears (by last name part) that differ from each."""
    from hpcmem.estimate.learned import nearer_default_cell
    from hpcmem.estimate.lora import lora_layout
    from hpcmem.job.shape import precision

    spec = record_spec(stored_trace_record("s8-343"))
    spec = dataclasses.replace(spec, train=dataclasses.replace(spec.train, lora_target_modules=targets))
    assert (nearer_default_cell(spec, precision(spec), lora_layout(spec)) is not None) is default


def test_jobs_drawn_after_the_rule(monkeypatch) -> None:
    """Seed 26, every job the final rule touches among its first 80,000 draws (19 traced): within 3 % 15 → 18, mean
    |error| 1.46 → 0.53 %. The one beyond, OPT DPO on q/k/v_proj, was over from the reference's cell too (+4.75 →
    +4.13 %)."""
    import hpcmem.estimate.learned as learned
    from hpcmem.datapath import estimator_dir

    path = estimator_dir() / "random" / "touched" / "nearer-default-26.jsonl"
    recs = [r for r in (json.loads(line) for line in path.read_text().splitlines())
            if (r.get("trace") or {}).get("peak_allocated_bytes")]
    assert len(recs) == 19
    new = {r["id"]: allocated_error_pct(record_spec(r), r) for r in recs}
    monkeypatch.setattr(learned, "nearer_default_cell", lambda *a, **k: None)
    old = {r["id"]: allocated_error_pct(record_spec(r), r) for r in recs}
    assert [i for i, e in new.items() if abs(e) > 3] == ["s26-3285"]
    assert sum(abs(e) for e in new.values()) / len(new) < 0.6 < 1.4 < sum(abs(e) for e in old.values()) / len(old)

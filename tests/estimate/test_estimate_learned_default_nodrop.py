"""LoRA on peft's default targets of a learned type, without dropout and with DoRA: the cells traced there
(`lora-default-nodrop`, `dora-default`: hpcmem.estimate.learned `default_cell`), not the reference's cells
(all-linear on most types) with every other adapter taken away. A DPO, KTO or Reward job keeps peft's default targets
unless the user names some (TRL passes target_modules=None), and TRL's disable_dropout turns its LoRA dropout off: the
everyday preference-tuning job. The subtraction kept the reference's peak instant, where the removed adapters' tensors
may no longer be alive: DoRA on GPT-NeoX's query_key_value read +7.7 %, the same job on all-linear +0.02 %.

Known answers: traces of random jobs (the real TRL trainers on fake tensors at full width). The jobs of
estimator/random/trace.jsonl named here are in-sample — the cells were added after their errors under the reference's
cells (−3.44, −3.38, +3.21, +7.68, +6.96 %); estimator/random/touched/default-nodrop.jsonl holds jobs drawn after it
from a fresh seed (`python -m hpcmem.lab.random_touched default-nodrop --seed 21`)."""

from __future__ import annotations

import dataclasses

import pytest

from tests.helpers.random_records import stored_trace_record

pytestmark = pytest.mark.torch

# DPO on Gemma and KTO on Nemotron-H and GPT-NeoX, peft's default targets, no dropout (disable_dropout, lora_dropout 0)
DEFAULT_NODROP = ["s4-172", "s5-39", "s1-589"]
# SFT with DoRA on GPT-NeoX's and Falcon's default target, query_key_value
DORA_DEFAULT = ["s3-5", "s6-19"]
# drawn after the cells were added (seed 21), the first five whose estimate warns of nothing: SFT at lora_dropout 0 on
# Falcon and StableLM, DPO on CodeGen, Nemotron-H and BLOOM
DRAWN_AFTER = ["s21-626", "s21-1184", "s21-1648", "s21-1394", "s21-2026"]
TOUCHED = "touched/default-nodrop.jsonl"
# DoRA, drawn likewise: the first four without warnings, SFT and GRPO on Gemma and RLOO on GPT-BigCode. The last
# reads +18.1 % with either cell: its estimate's peak is RLOO's no-grad log-prob pass on a 145 MiB model, not the
# adapters (estimator/LOG.md), so only its cell is held here
DORA_DRAWN_AFTER = ["s21-1490", "s21-1875", "s21-3470"]
DORA_TOUCHED = "touched/dora-default.jsonl"


def _spec(rec: dict):
    from hpcmem.validate.random_jobs import RandomJob
    from hpcmem.validate.random_model import job_spec

    return job_spec(RandomJob.from_dict(rec["job"]))


def _error_pct(spec, rec: dict) -> float:
    """The allocated peak's error as the random report scores it (hpcmem.validate.random_trace `estimated`)."""
    from hpcmem.estimate.workspaces import tensor_bytes
    from hpcmem.validate.random_trace import as_traced, scored_as_traced

    est = as_traced(scored_as_traced(spec))[0]
    traced = rec["trace"]["peak_allocated_bytes"]      # tensors only: cuBLAS's workspaces out, as the trace counts
    return 100.0 * (max(tensor_bytes(p) for p in est.phases) - traced) / traced


def _cell_name(spec) -> str:
    from hpcmem.estimate.learned import learned_cell, precision_key
    from hpcmem.estimate.lora import lora_layout
    from hpcmem.job.shape import micro_batch, precision

    prec = precision(spec)
    cell, _ = learned_cell(spec, prec, lora_layout(spec), micro_batch(spec))
    return next(k for k, c in spec.model.learned.cells.items() if c is cell and k.startswith(precision_key(prec)))


def _without(spec, *techniques: str):
    """The job on its profile less the named cells (a profile learned before the learner traced them)."""
    p = spec.model.learned
    cells = {k: c for k, c in p.cells.items() if k.split("/")[1] not in techniques}
    return dataclasses.replace(spec, model=dataclasses.replace(spec.model, learned=dataclasses.replace(p, cells=cells)))


@pytest.mark.parametrize(("job_id", "records"), [(i, "trace.jsonl") for i in DEFAULT_NODROP]
                         + [(i, TOUCHED) for i in DRAWN_AFTER])
def test_default_targets_without_dropout_take_their_cell(job_id: str, records: str) -> None:
    rec = stored_trace_record(job_id, records)
    spec = _spec(rec)
    assert not spec.train.lora_target_modules
    assert "/lora-default-nodrop/" in _cell_name(spec)
    assert abs(_error_pct(spec, rec)) < 2.0
    from hpcmem.estimate import estimate

    # held as the no-dropout cells are: no "traced with dropout 0.05" warning
    assert not any("LoRA cells were traced with dropout" in w for w in estimate(spec).not_held)


@pytest.mark.parametrize("job_id", DORA_DEFAULT)
def test_dora_on_default_targets_takes_its_cell(job_id: str) -> None:
    rec = stored_trace_record(job_id)
    spec = _spec(rec)
    assert spec.train.use_dora and not spec.train.lora_target_modules
    assert "/dora-default/" in _cell_name(spec)
    assert abs(_error_pct(spec, rec)) < 1.0
    # without the cell: the reference's DoRA cell with the MLP's and dense's adapters subtracted, far over
    assert _error_pct(_without(spec, "dora-default"), rec) > 5.0


@pytest.mark.parametrize("job_id", [*DORA_DRAWN_AFTER, "s21-2452"])
def test_dora_drawn_after_the_cells(job_id: str) -> None:
    rec = stored_trace_record(job_id, DORA_TOUCHED)
    spec = _spec(rec)
    assert "/dora-default/" in _cell_name(spec)
    if job_id in DORA_DRAWN_AFTER:
        assert abs(_error_pct(spec, rec)) < 1.0


def test_a_profile_with_only_the_dropout_default_cell_adds_the_dropout_difference_and_says_so() -> None:
    from hpcmem.estimate import estimate

    rec = stored_trace_record("s4-172")
    spec = _without(_spec(rec), "lora-default-nodrop")
    assert "/lora-default/" in _cell_name(spec)
    assert abs(_error_pct(spec, rec)) < 2.0
    (line,) = [w for w in estimate(spec).not_held if "LoRA cells were traced with dropout" in w]
    assert "dropout 0.05" in line and "no LoRA dropout" in line


def test_reentrant_checkpointing_takes_the_default_cells_reentrant_variant() -> None:
    # KTO on OPT, default targets, use_reentrant True: −6.65 % on the reentrant no-dropout cell (all-linear) with the
    # other adapters subtracted (the same job traced with all-linear: −0.22 %)
    rec = stored_trace_record("s3-9")
    spec = _spec(rec)
    assert spec.reentrant_checkpointing and not spec.train.lora_target_modules
    assert "/lora-default-nodrop-reentrant/" in _cell_name(spec)
    assert abs(_error_pct(spec, rec)) < 1.0
    # a profile without it keeps the reentrant no-dropout cell (the default cells' other variants have no reentrant one)
    assert "/lora-nodrop-reentrant/" in _cell_name(_without(spec, "lora-default-nodrop-reentrant"))


def test_add_missing_wants_the_default_variants_beside_a_default_cell() -> None:
    from hpcmem.trace.learn import missing_cells

    p = _spec(stored_trace_record("s4-172")).model.learned
    bare = dataclasses.replace(p, cells={k: c for k, c in p.cells.items() if k.split("/")[1] not in (
        "lora-default-nodrop", "dora-default", "lora-default-nodrop-reentrant")})
    wanted = missing_cells(bare)
    assert {("lora-default-nodrop", True), ("dora-default", True),
            ("lora-default-nodrop-reentrant", True)} <= set(wanted)
    # the no-dropout default cell before its reentrant variant: learn_cells traces them in this order
    assert wanted.index(("lora-default-nodrop", True)) < wanted.index(("lora-default-nodrop-reentrant", True))
    assert not {t for t, _ in missing_cells(p)} & {"lora-default-nodrop", "dora-default"}
    # no lora-default cell (peft's default targets are the reference's, or peft has none): nothing on them
    plain = dataclasses.replace(bare, cells={k: c for k, c in bare.cells.items() if "/lora-default/" not in k})
    assert not {t for t, _ in missing_cells(plain)} & {"lora-default-nodrop", "dora-default",
                                                        "lora-default-nodrop-reentrant"}

"""LoRA without dropout on learned types: the `lora-nodrop` cells (hpcmem.estimate.learned `nodrop_cell`), traced with
the reference adapters at lora_dropout 0 (hpcmem/trace/learn.py `learn_job`) and added to stored sweep profiles by
`learn_cells`. A DPO, KTO or Reward job (TRL's disable_dropout sets peft's nn.Dropout to p = 0) and an SFT job with
lora_dropout 0 take them; before, they took the dropout cells with the difference formulas, which do not place which
of the dropout's tensors a layer's peak holds.

Known answers: stored traces of random jobs (estimator/random/trace.jsonl: the real TRL trainers on fake tensors at
full width, types and settings drawn at random), none of which the cells were learned on (the cells are traced on the
learner's cut at 2 rows × three lengths; these jobs have other depths, rows, lengths, ranks and targets)."""

from __future__ import annotations

import json

import pytest

from hpcmem.errors import SpecError
from tests.helpers.random_records import stored_trace_record


# SFT at lora_dropout 0 and DPO (disable_dropout) on Falcon, Sarvam-MoE and Qwen3.5-MoE: −6.3, −4.2 and −3.4 % with the
# dropout cells and the difference formulas
NODROP_JOBS = ["s5-77", "s7-34", "s1-566"]


def _estimate(rec: dict, **settings):
    from hpcmem.validate.random_jobs import RandomJob
    from hpcmem.validate.random_model import job_spec
    from hpcmem.validate.random_trace import as_traced

    job = dict(rec["job"], settings={**rec["job"]["settings"], **settings})
    return as_traced(job_spec(RandomJob.from_dict(job)))[0]


def _error_pct(est, rec: dict) -> float:
    from hpcmem.estimate.workspaces import tensor_bytes

    traced = rec["trace"]["peak_allocated_bytes"]      # tensors only: cuBLAS's workspaces out, as the trace counts
    return 100.0 * (max(tensor_bytes(p) for p in est.phases) - traced) / traced


@pytest.mark.torch
@pytest.mark.parametrize("job_id", NODROP_JOBS)
def test_lora_without_dropout_within_one_percent_of_the_trace(job_id: str) -> None:
    rec = stored_trace_record(job_id)
    est = _estimate(rec)
    assert abs(_error_pct(est, rec)) < 1.0
    # held as the no-dropout cells are: no "traced with dropout 0.05" warning
    assert not any("LoRA cells were traced with dropout" in w for w in est.not_held)


@pytest.mark.torch
def test_modules_to_save_still_says_the_cells_have_none() -> None:
    est = _estimate(stored_trace_record(NODROP_JOBS[0]), lora_modules_to_save=["lm_head"])
    (line,) = [w for w in est.not_held if "LoRA cells were traced with dropout" in w]
    assert "dropout 0 and no modules to save" in line and "lora_modules_to_save lm_head" in line


@pytest.mark.torch
def test_learn_cells_refuses_a_profile_of_another_config() -> None:
    from hpcmem.estimate.learned import NODROP
    from hpcmem.models.profile import profile_from_dict
    from hpcmem.trace.learn import learn_cells
    from hpcmem.validate.coverage import profiles_dir, reference_config

    stored = profile_from_dict(json.loads((profiles_dir() / "gpt2.json").read_text()))
    cfg = dict(reference_config("gpt2")[0], n_embd=1024)
    with pytest.raises(SpecError, match="learned from another config") as refused:
        learn_cells(cfg, stored, [(NODROP, True)])
    assert "\n" not in str(refused.value).strip()

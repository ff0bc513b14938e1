"""A learned profile's head terms hold the fused LM head of the jobs they were traced on, solved through three lengths
at 2 rows. The head's tile stops growing at 4,096 scored tokens (trl/kernels/chunked_logprob.py TOKEN_CHUNK_SIZE), so
the polynomial through those heads is not the head past that: OPT (2,048 positions, learned at 2 × 128/512/2,048
tokens, all below the limit) carried a straight line on, and a 4-row job at 2,048 tokens stood +18 % over its
trace (+27 % in the profile's own rows check), DPO at 14 × 1,012 (s1-186) +62 %. The estimate now takes out the
polynomial the terms hold (hpcmem.estimate.learned `head_out`) and puts in the job's own head.

The oracle is the trace of the real modelling code and TRL's SFTTrainer on fake tensors (run here: OPT's cut is three
small layers), and the stored traces of random jobs the change was not written on.
"""

from __future__ import annotations

import pytest

from tests.helpers.random_records import stored_trace_record


def _opt_spec():
    """The sweep's OPT profile on the probe its rows check runs (hpcmem.validate.coverage `check_rows`)."""
    from dataclasses import replace

    from hpcmem.models.profile import load_profile, spec_from_profile
    from hpcmem.validate.coverage import TECHNIQUES, learning_probe, profiles_dir, reference_config, sweep_techniques

    stored = load_profile(profiles_dir() / "opt.json")
    probe = learning_probe(reference_config("opt")[0], [TECHNIQUES[t] for t in sweep_techniques("opt")])[0]
    return spec_from_profile(replace(probe, cells=stored.cells), "opt"), stored


@pytest.mark.torch
@pytest.mark.parametrize(("rows", "seq"), [(4, 2048), (14, 1024)])
def test_more_rows_past_the_head_tile_against_the_trace(rows: int, seq: int) -> None:
    from hpcmem.estimate import estimate
    from hpcmem.estimate.workspaces import tensor_bytes
    from hpcmem.trace import run_trace
    from hpcmem.trace.learn import learn_job

    spec, stored = _opt_spec()
    # the profile was learned below the tile's limit: every traced job scored < 4,096 tokens
    assert stored.provenance["rows"] * (stored.provenance["seqs"][-1] - 1) < 4096 < rows * (seq - 1)
    job = learn_job(spec, "bfloat16", "full", True, seq, rows=rows)
    traced = run_trace(job).peak_allocated_bytes
    est = max(tensor_bytes(p) for p in estimate(job).phases)
    assert abs(est - traced) / traced < 0.01, (est, traced)


@pytest.mark.torch
@pytest.mark.parametrize(("job_id", "was"), [
    ("s1-203", -7.5),   # ModernBERT-decoder, 8 rows: the limit between the learned lengths (the bent polynomial)
    ("s1-265", 6.4),    # MiniCPM3, 7 rows
    ("s1-72", 6.1),     # ZAYA, 4 rows
])
def test_stored_random_jobs_with_many_rows_within_3_percent(job_id: str, was: float) -> None:
    from hpcmem.validate.random_trace import score

    got = score(stored_trace_record(job_id))
    assert abs(got["err_pct"]) <= 3.0 < abs(was), got


@pytest.mark.torch
def test_opt_dpo_with_14_rows_no_longer_62_percent_over() -> None:
    """s1-186 (OPT, DPO 7 pairs × 1,012 tokens: 14 rows) stood +61.9 % over its trace; +3.8 % is left (a DPO head
    beside the SFT heads the cell was traced with: not looked into)."""
    from hpcmem.validate.random_trace import score

    got = score(stored_trace_record("s1-186"))
    assert 0 < got["err_pct"] < 5.0, got

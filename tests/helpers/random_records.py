"""The stored record of one random job (estimator/random/trace.jsonl, written by `hpcmem validate random --oracle
trace`): the trace of the real TRL code that tests hold the estimate to."""

from __future__ import annotations

import json

from hpcmem.datapath import estimator_dir


def stored_trace_record(job_id: str, records: str = "trace.jsonl") -> dict:
    """`records`: a file under estimator/random (touched/<rule>.jsonl: jobs drawn for a rule by hpcmem.lab.
    random_touched)."""
    for line in (estimator_dir() / "random" / records).read_text().splitlines():
        rec = json.loads(line)
        if rec["id"] == job_id:
            return rec
    raise AssertionError(f"{job_id}: no stored record")


def record_spec(rec: dict):
    """The JobSpec of a stored random job, as the random oracles build it."""
    from hpcmem.validate.random_jobs import RandomJob
    from hpcmem.validate.random_model import job_spec

    return job_spec(RandomJob.from_dict(rec["job"]))


def scored_estimate(spec):
    """The estimate over the instants the trace runs (hpcmem.validate.random_trace `as_traced`)."""
    from hpcmem.validate.random_trace import as_traced, scored_as_traced

    return as_traced(scored_as_traced(spec))[0]


def allocated_error_pct(spec, rec: dict) -> float:
    """The allocated peak's error against the record's trace, as the random report scores it (tensors only: cuBLAS's
    workspaces out, as the trace counts)."""
    from hpcmem.estimate.workspaces import tensor_bytes

    traced = rec["trace"]["peak_allocated_bytes"]
    return 100.0 * (max(tensor_bytes(p) for p in scored_estimate(spec).phases) - traced) / traced


def without_cells(spec, marker: str):
    """The job on its learned profile less the cells whose key holds `marker` (a profile learned before them)."""
    import dataclasses

    p = spec.model.learned
    cells = {k: c for k, c in p.cells.items() if marker not in k}
    return dataclasses.replace(spec, model=dataclasses.replace(spec.model, learned=dataclasses.replace(p, cells=cells)))

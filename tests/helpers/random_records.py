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

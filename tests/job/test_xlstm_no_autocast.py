"""xLSTM on 16-bit weights with bf16 and fp16 off: the chunkwise mLSTM kernel multiplies fp32-gated keys with 16-bit
values, which torch refuses without autocast once a row holds a whole chunk (hpcmem.job.kernel_limits
`xlstm_dtype_problems`). Known answers: the real transformers code traced on fake tensors — a random job drawn from
a fresh seed for the no-autocast cells (estimator/random/touched/noamp.jsonl, s21-211: 262 tokens per row, refused
with torch's own message) and the same job cut to 40 tokens per row, which runs (the step kernel promotes
elementwise)."""

from __future__ import annotations

import pytest

from hpcmem.errors import SpecError
from tests.helpers.random_records import stored_trace_record

pytestmark = pytest.mark.torch


def _spec(job: dict):
    from hpcmem.validate.random_jobs import RandomJob
    from hpcmem.validate.random_model import job_spec

    return job_spec(RandomJob.from_dict(job))


def test_a_row_of_whole_chunks_is_refused_as_the_real_code_refuses_it() -> None:
    rec = stored_trace_record("s21-211", "touched/noamp.jsonl")
    assert rec["outcome"].startswith("refused:") and "expected scalar type" in rec["outcome"]
    assert rec["job"]["settings"]["bf16"] is False and rec["job"]["settings"]["max_length"] >= 64
    with pytest.raises(SpecError) as err:
        _spec(rec["job"])
    line = str(err.value)
    assert "chunkwise mLSTM kernel" in line and "chunk_size 64" in line and "bf16" in line


def test_a_row_shorter_than_a_chunk_runs_and_is_estimated() -> None:
    from hpcmem.estimate import estimate
    from hpcmem.trace import run_trace

    rec = stored_trace_record("s21-211", "touched/noamp.jsonl")
    # two of its twelve layers (the kernel runs in every layer alike), 40 tokens per row
    short = {**rec["job"], "layers": 2, "config": {**rec["job"]["config"], "num_hidden_layers": 2},
             "settings": {**rec["job"]["settings"], "max_length": 40}}
    spec = _spec(short)
    assert run_trace(spec).peak_allocated_bytes > 0       # the real code runs it
    assert estimate(spec).peak_allocated_bytes > 0
    # with bf16 on, autocast casts both operands: the whole-chunk row is not refused
    assert _spec({**rec["job"], "settings": {**rec["job"]["settings"], "bf16": True}}).model.model_type == "xlstm"

"""One unpadded row on a profile whose padded-row cells do not scale down to one row: its one-row cells
(hpcmem/trace/learn.py `one_row_cells`, hpcmem.estimate.learned `one_row`).

DeepSeek-V3.2-style sparse attention (glm_moe_dsa, deepseek_v32, axk2, dots3) reads a 4-D mask and builds
[rows, seq, seq] index scores on every row, padded or not, while padded rows add more [rows, seq, seq] tensors: the
learner's rows check at one row missed both ways (GLM-MoE-DSA at 1 × 32,768: −38.9 % with the padded rows' rows·seq²
terms dropped, +63.2 % kept). Known answers: the stored traces of three random jobs that pack into one row
(estimator/random/trace.jsonl, the real TRL/transformers code on fake tensors), which the estimate put +89 %, +145 %
and +48 % over with the padded cells."""

from __future__ import annotations

import json

import pytest

from hpcmem.datapath import estimator_dir
from hpcmem.models.profile import Cell, one_row_key, profile_from_dict, profile_to_dict
from tests.helpers.random_records import stored_trace_record


@pytest.mark.torch
@pytest.mark.parametrize("job_id", [
    "s1-565",   # glm_moe_dsa SFT, full fine-tuning without checkpointing, one packed row of 25,178 tokens
    "s1-306",   # glm_moe_dsa SFT, full fine-tuning with checkpointing, 4 × 40,810 packed into one row of 163,240
    "s1-597",   # deepseek_v32 SFT, DoRA all-linear, checkpointing, 5 × 15,513 packed into one row
])
def test_one_packed_row_within_one_percent_of_its_trace(job_id: str) -> None:
    from hpcmem.validate.random_jobs import RandomJob
    from hpcmem.validate.random_model import job_spec
    from hpcmem.validate.random_trace import as_traced

    rec = stored_trace_record(job_id)
    spec = job_spec(RandomJob.from_dict(rec["job"]))
    assert any(k.endswith("/1row") for k in spec.model.learned.cells)
    est, _ = as_traced(spec)
    traced = rec["trace"]["peak_allocated_bytes"]
    assert abs(est.peak_allocated_bytes - traced) / traced < 0.01


def test_a_one_row_cell_keeps_its_rows_through_the_file_and_falls_back_where_absent() -> None:
    doc = json.loads((estimator_dir() / "coverage-profiles" / "glm_moe_dsa.json").read_text())
    p = profile_from_dict(doc)
    one = p.cell("w2a2", "full", True, one_row=True)
    assert isinstance(one, Cell) and one.rows == 1 and one is p.cells[one_row_key("w2a2/full/gc")]
    assert p.cell("w2a2", "full", True).rows == 0
    again = profile_from_dict(profile_to_dict(p))
    assert again.cells[one_row_key("w2a2/full/gc")].rows == 1
    # a technique without a one-row cell takes the padded rows' cell
    bare = profile_from_dict({**doc, "cells": {k: v for k, v in doc["cells"].items() if "1row" not in k}})
    assert bare.cell("w2a2", "full", True, one_row=True) is bare.cells["w2a2/full/gc"]

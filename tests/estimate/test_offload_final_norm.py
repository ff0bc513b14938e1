"""Activation offloading under checkpointing: what the final norm's backward brought back stays through the last
layer's backward (hpcmem.models.final_norm), held to the trace."""

from __future__ import annotations

import json

import pytest

from hpcmem.lab.final_norm_scan import width
from hpcmem.models.final_norm import restored_width
from hpcmem.validate.random_run import load, records_path
from hpcmem.validate.random_trace import score

pytestmark = [pytest.mark.torch, pytest.mark.slow]


def _stored(job_id: str) -> dict:
    for rec in load(records_path("trace")):
        if rec.get("id") == job_id:
            return rec
    raise AssertionError(f"no stored random record {job_id}")


@pytest.mark.parametrize("model_type", ["gpt2", "smollm3", "hy_v4"])
def test_table_width_is_the_traced_one(model_type: str) -> None:
    # a LayerNorm's 16-bit input (GPT-2), an upcasting RMSNorm's fp32 one (SmolLM3), four fp32 residual streams
    # (HY-V4's hyper-connections): traced afresh, per token per hidden unit at bf16 weights
    got = width(_stored_job_of(model_type))
    assert "refused" not in got, got
    assert got["width"] == pytest.approx(restored_width(model_type, 2), abs=0.05)


def _stored_job_of(model_type: str) -> dict:
    return next(r["job"] for r in load(records_path("trace")) if r.get("job") and r["job"]["model_type"] == model_type)


def test_lfm2_offloaded_job_peaking_in_the_last_layer_is_within_its_trace() -> None:
    # random seed 3 job 174: LFM2 SFT, LoRA all-linear without dropout or autocast, 8 × 43,040 tokens, offloading
    # under checkpointing; the trace's peak is in the last layer's backward with the final norm's fp32 input brought
    # back (8 × 43,040 × 2,560 × 4 bytes = 3.53 GB of 142.3 GB): without it the estimate read -3.70 %
    rec = _stored("s3-174")
    assert rec["trace"]["phase"] == "step 2 / backward / layer 2"
    got = score(rec)
    assert abs(got["err_pct"]) <= 3.0, json.dumps(got)[:400]


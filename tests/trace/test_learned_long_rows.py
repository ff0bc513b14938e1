"""Learned profiles held at long rows: three learned types (SmolLM3: sdpa with NoPE layers; gpt-oss: MoE, eager
attention with sinks; Ministral: sdpa) estimated from the profile `hpcmem validate coverage` learned
(estimator/coverage-profiles, learned at ≤ 8,192 tokens per row on a reduced depth) and held to a trace of the same
job, computed here, at 8,192 and 32,768 tokens per row, with and without checkpointing, and with DoRA — on a cut
deeper than the learned one (out of sample in depth; out of sample in length at 32,768)."""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

import pytest

pytestmark = [pytest.mark.torch, pytest.mark.slow]
pytest.importorskip("trl")

# (type, layers of the cut, tokens per row, technique of validate coverage, DoRA): each type at both lengths, with and
# without checkpointing, once with DoRA — nine traces, ~2–3 minutes on two cores
CASES = [
    ("smollm3", 6, 8192, "full+gc", False),
    ("smollm3", 6, 32768, "full gc off", False),
    ("smollm3", 6, 32768, "lora+gc", True),
    ("gpt_oss", 6, 32768, "full+gc", False),
    ("gpt_oss", 6, 8192, "lora gc off", False),
    ("gpt_oss", 6, 8192, "lora+gc", True),
    ("ministral", 5, 8192, "full gc off", False),
    ("ministral", 5, 32768, "lora+gc", False),
    ("ministral", 5, 32768, "lora gc off", True),
]


@pytest.mark.parametrize(("model_type", "layers", "seq", "technique", "dora"), CASES)
def test_learned_estimate_within_3_percent_of_the_trace_at_long_rows(model_type, layers, seq, technique, dora):
    from hpcmem.estimate import estimate
    from hpcmem.estimate.workspaces import tensor_bytes
    from hpcmem.trace import run_trace
    from hpcmem.validate import coverage as cov

    cfg, _ = cov.reference_config(model_type)
    profile = cov.sweep_profile(model_type, cfg)
    assert profile is not None and profile.held["max_length"] >= seq, profile and profile.held
    spec, depth, _ = cov.eval_model(cfg, model_type, profile, Path(tempfile.mkdtemp(prefix="hpcmem-long-")), layers)
    assert depth > profile.provenance["depth"]                       # deeper than learned
    job = cov.eval_job(spec, technique)
    job = replace(job, train=replace(job.train, max_length=seq, use_dora=dora))
    est = estimate(job)
    assert not [w for w in est.warnings if "held" in w]              # inside the held range: no warning
    estimated = max(tensor_bytes(p) for p in est.phases)
    traced = run_trace(job).peak_allocated_bytes
    assert abs(estimated - traced) <= 0.03 * traced, (estimated, traced, 100 * (estimated - traced) / traced)

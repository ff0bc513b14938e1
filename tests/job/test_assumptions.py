"""A value the estimate assumes rather than reads is said, with the flag that sets it (--json "assumed")."""

from __future__ import annotations

import dataclasses

import pytest

from hpcmem.estimate import estimate
from hpcmem.job.trl_config import build_job

MODEL = {"model_name_or_path": "Qwen/Qwen2.5-0.5B"}


def test_grpos_prompt_length_is_an_assumption_because_grpoconfig_has_no_such_field():
    trl = pytest.importorskip("trl")
    assert "max_prompt_length" not in {f.name for f in dataclasses.fields(trl.GRPOConfig)}
    job, _ = build_job("grpo", MODEL)
    assumed = estimate(job).to_json()["assumed"]
    assert [a["field"] for a in assumed] == ["max_prompt_length"] and assumed[0]["value"] == 512
    assert "--max_prompt_length" in assumed[0]["set_with"]
    job, _ = build_job("grpo", {**MODEL, "max_prompt_length": 256})
    assert estimate(job).to_json()["assumed"] == []


def test_row_lengths_are_an_assumption_until_a_profile_gives_them():
    job, _ = build_job("sft", {**MODEL, "max_length": 2048})
    assert [(a["field"], a["value"]) for a in estimate(job).assumed] == [("row lengths", 2048)]
    job, _ = build_job("sft", {**MODEL, "max_length": 2048, "tokens_per_micro_batch": 4096})
    assert estimate(job).assumed == ()

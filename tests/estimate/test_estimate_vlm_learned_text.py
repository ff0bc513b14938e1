"""A learned text profile standing in for a vision-language model's derived decoder terms: DeepSeek-VL's cut
(tests/fixtures/vlm/deepseek-vl-1.3b-width-L1-D4-384.json's Llama text_config, 1 layer of width 2048) learned by
hpcmem.trace.learn `learn` (bfloat16; full and LoRA, checkpointing on and off; the profile is
tests/fixtures/vlm/deepseek-vl-1.3b-width-L1-text-profile.json), the tower's terms added as for the derived decoder,
held against the stored traces of TRL's SFTTrainer and DPOTrainer with images (estimator/traces/vlm-deepseek-vl.jsonl,
vlm-deepseek-vl-dpo.jsonl): the traced numbers are the trace's, not the estimate's."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from hpcmem.estimate import estimate
from hpcmem.estimate.workspaces import tensor_bytes
from hpcmem.models.profile import profile_from_dict
from tests.helpers.stored_cases import stored_case_job, trace_records

ROOT = Path(__file__).resolve().parents[2]
RECORDS = trace_records(ROOT, "vlm-deepseek-vl", "vlm-deepseek-vl-dpo")
PROFILE = ROOT / "tests/fixtures/vlm/deepseek-vl-1.3b-width-L1-text-profile.json"


def _learned_text(case_id: str):
    job = stored_case_job(RECORDS[case_id], ROOT)
    profile = profile_from_dict(json.loads(PROFILE.read_text()))
    return replace(job, model=replace(job.model, learned=profile))


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_learned_text_with_the_tower_within_3_percent_of_the_trace(case_id):
    traced = RECORDS[case_id]["traced"]
    est = estimate(_learned_text(case_id))
    assert est.made.startswith("learned profile")
    assert abs(max(tensor_bytes(p) for p in est.phases) - traced) <= 3 / 100 * traced


def test_the_profile_is_the_fixture_text_config():
    cfg = json.loads((ROOT / "tests/fixtures/vlm/deepseek-vl-1.3b-width-L1-D4-384.json").read_text())["text_config"]
    profile = profile_from_dict(json.loads(PROFILE.read_text()))
    assert (profile.hidden_size, profile.vocab_size, profile.num_layers) == (
        cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"])
    assert len(RECORDS) == 8 + 4

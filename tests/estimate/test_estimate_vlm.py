"""Vision-language SFT (Qwen2.5-VL, full width cut to 1 decoder layer and 4 vision blocks) against the trace of TRL's
SFTTrainer with its vision collator and transformers' processor on real images (estimator/traces/vlm.jsonl, written by
`hpcmem validate trace --cases estimator/cases/vlm.yaml`, and vlm-accumulation.yaml): full fine-tuning and LoRA
(all-linear, q_proj/v_proj), checkpointing on and off, 448 and 896 px, one case of 2 rows × 2 images, two with 2
micro-batches per step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.estimate import estimate
from hpcmem.estimate.vision import ACTIVATIONS, GRADIENTS, OPTIMIZER, WEIGHTS
from hpcmem.estimate.workspaces import tensor_bytes
from hpcmem.validate.cases import case_job

ROOT = Path(__file__).resolve().parents[2]
TRACES = [ROOT / "estimator" / "traces" / f"{name}.jsonl" for name in ("vlm", "vlm-accumulation")]
RECORDS = {r["case"]["id"]: r for f in TRACES for r in map(json.loads, f.read_text().splitlines())}
MAX_PCT = 3.0


def _job(case_id: str):
    return case_job({**RECORDS[case_id]["case"],
                     "model_name_or_path": str(ROOT / RECORDS[case_id]["case"]["model_name_or_path"])})


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    traced = RECORDS[case_id]["traced"]
    estimated = max(tensor_bytes(p) for p in estimate(_job(case_id)).phases)
    assert abs(estimated - traced) <= MAX_PCT / 100 * traced, (estimated, traced)


def test_the_tower_is_its_own_components():
    """Full fine-tuning: the tower's weights, Adam states, saved activations and gradients are printed apart, and the
    weights are its parameters × 2 bytes (bf16), the Adam states twice that (by hand: hpcmem.models.vision)."""
    job = _job("qvl-full-gc-896")
    est = estimate(job)
    names = {c.name for p in est.phases for c in p.components}
    assert {WEIGHTS, OPTIMIZER, ACTIVATIONS, GRADIENTS} <= names
    weights = next(c.bytes for c in est.phases[0].components if c.name == WEIGHTS)
    assert weights == 2 * job.model.vision.num_params
    assert next(c.bytes for c in est.phases[0].components if c.name == OPTIMIZER) == 2 * weights
    assert est.to_json()["vision"]["patches_per_micro_batch"] == 64 * 64


def test_more_pixels_more_memory_in_the_trace_and_the_estimate():
    for technique in ("full-gc", "full-nogc", "lora-all-gc", "lora-all-nogc"):
        small, large = f"qvl-{technique}-448", f"qvl-{technique}-896"
        traced = RECORDS[large]["traced"] - RECORDS[small]["traced"]
        est = (max(tensor_bytes(p) for p in estimate(_job(large)).phases)
               - max(tensor_bytes(p) for p in estimate(_job(small)).phases))
        assert traced > 0 and est > 0, technique


@pytest.mark.torch
@pytest.mark.slow
def test_the_recorded_trace_is_the_trace_of_today():
    """One case traced again (TRL's SFTTrainer, the vision collator, transformers' processor; about a minute on two
    shared cores): the stored record is what the installed libraries trace, to the byte."""
    pytest.importorskip("trl")
    from hpcmem.trace.run import run_trace

    case_id = "qvl-full-gc-448"
    assert run_trace(_job(case_id)).peak_allocated_bytes == RECORDS[case_id]["traced"]

"""Selective activation checkpointing (TRL's SAC) against the trace: what it keeps per layer, and what the layer's
recompute then does not create again. Known answers: pairs of matrix cases traced with SAC and with full
checkpointing on the same shape (estimator/traces/sft.jsonl, `hpcmem validate --against trace`)."""

from __future__ import annotations

import json
from pathlib import Path

from hpcmem.estimate import estimate
from hpcmem.validate.cases import case_job

TRACES = Path(__file__).resolve().parents[2] / "estimator" / "traces" / "sft.jsonl"


def _traced(*ids: str) -> list[dict]:
    found = {}
    for line in TRACES.read_text().splitlines():
        rec = json.loads(line)
        if rec["case"]["id"] in ids:
            found[rec["case"]["id"]] = rec
    return [found[i] for i in ids]


def _phase(rec: dict, name: str) -> dict[str, int]:
    phase = next(p for p in estimate(case_job(rec["case"])).phases if p.name == name)
    return {c.name: c.bytes for c in phase.components}


def test_sdpa_sac_moves_the_attention_outputs_from_the_recompute_to_the_kept_set():
    sac, full = _traced("llama1b-sac-2k", "llama1b-bf16-gc-2k")
    # Llama-3.2-1B, 2 rows × 2048: the SDPA op's output [T, 32 heads × 64] bf16 and its fp32 logsumexp [32, T]
    tokens = 2 * 2048
    moved = 2 * 32 * 64 * tokens + 4 * 32 * tokens
    ts, tf = sac["traced_components"], full["traced_components"]
    assert sac["traced"] == full["traced"]                  # the same peak, at layer 0's backward in both
    assert ts["activation"] - tf["activation"] == moved == tf["temporary"] - ts["temporary"]
    es, ef = _phase(sac, "backward (layer 0)"), _phase(full, "backward (layer 0)")
    assert es["activations"] - ef["activations"] == moved
    assert ef["recompute (one layer)"] - es["recompute (one layer)"] == moved
    assert sum(es.values()) == sum(ef.values())


def test_eager_attention_sac_keeps_what_full_checkpointing_keeps():
    # Gemma2 runs eager attention: no op the SAC policy saves, so the trace cannot tell SAC from full checkpointing
    sac, full = _traced("gemma2-9b-sac-4k", "gemma2-9b-bf16-gc-4k")
    assert sac["traced_components"] == full["traced_components"]
    es, ef = estimate(case_job(sac["case"])), estimate(case_job(full["case"]))
    assert es.peak_allocated_bytes == ef.peak_allocated_bytes
    assert [(p.name, sum(c.bytes for c in p.components)) for p in es.phases] == \
        [(p.name, sum(c.bytes for c in p.components)) for p in ef.phases]

"""The peak inside one decoder layer's backward, against the trace: with full fine-tuning and a gated MLP it is the MLP
product's backward, where of the layer's weight gradients only down_proj's exists."""

from __future__ import annotations

import json
from pathlib import Path

from hpcmem.estimate import estimate
from hpcmem.validate.cases import case_job

TRACES = Path(__file__).resolve().parents[2] / "estimator" / "traces" / "sft.jsonl"


def _traced(case_id: str) -> dict:
    return next(r for r in map(json.loads, TRACES.read_text().splitlines()) if r["case"]["id"] == case_id)


def test_layer0_backward_holds_down_proj_gradient_only():
    rec = _traced("llama1b-bf16-gc-2k")       # Llama-3.2-1B, 2 rows × 2048, bf16, full checkpointing
    h, inter, layers, vocab = 2048, 8192, 16, 128256
    per_layer = 2 * h * h + 2 * h * 512 + 3 * h * inter + 2 * h      # q,o + k,v (8 kv heads × 64) + MLP + 2 norms
    grads_done = 2 * (vocab * h + h + (layers - 1) * per_layer)       # tied head/embedding, final norm, layers 15..1
    assert rec["traced_phase"] == "step 2 / backward / layer 0"
    assert rec["traced_components"]["grad"] == grads_done + 2 * h * inter
    est = estimate(case_job(rec["case"]))
    phase = next(p for p in est.phases if p.name == "backward (layer 0)")
    comps = {c.name: c.bytes for c in phase.components}
    traced_total = sum(rec["traced_components"].values())
    assert abs(sum(comps.values()) - comps.get("cuBLAS workspaces", 0) - traced_total) < 0.002 * traced_total

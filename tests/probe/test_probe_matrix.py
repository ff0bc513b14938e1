"""The GPU kit run on CPU: `python -m hpcmem.probe.matrix --device cpu --tiny` shrinks each case's architecture and
writes one record per case (an OOM case included)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.torch, pytest.mark.slow]
pytest.importorskip("trl")


def test_tiny_matrix_on_cpu_writes_records(tmp_path: Path) -> None:
    from hpcmem.record import read_records

    out = tmp_path / "cpu.jsonl"
    cases = "sft-qwen05-lora,grpo-qwen05-full,sft-llama8b-full-oom"
    proc = subprocess.run([sys.executable, "-m", "hpcmem.probe.matrix", "--device", "cpu", "--tiny", "--steps", "2",
                           "--only", cases, "--out", str(out), "--budget-s", "600"],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = read_records(out)
    assert [(r.cell[0], r.status) for r in records] == [("sft", "ok"), ("grpo", "ok"), ("sft", "oom")]
    assert [r.case for r in records] == cases.split(",")          # each record names its matrix case
    grpo = records[1].measured
    assert "generation" in grpo.extra["phases"] and records[0].cell[1] == "lora+gc"
    assert all(r.job["model"]["hidden_size"] == 64 for r in records)

"""The GPU kit run on CPU: `python -m hpcmem.probe.matrix --device cpu --tiny` shrinks each case's architecture and
writes one record per case (an OOM case included)."""

from __future__ import annotations

import dataclasses
import json
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


@pytest.mark.parametrize(("case", "cell"), [("sft-qwen25vl7b-lora-img", ("sft", "lora+gc")),
                                           ("dpo-qwen25vl7b-lora-img", ("dpo", "lora+gc")),
                                           ("grpo-qwen25vl7b-lora-img", ("grpo", "lora+gc"))])
def test_the_kit_probes_an_image_job_as_the_trace_builds_it(tmp_path: Path, case: str, cell: tuple) -> None:
    """The kit's Qwen2.5-VL cells, shrunk: TRL's SFT / DPO / GRPO trainer on the trace's processor and image rows
    (56 × 56 px, one image a row or prompt: 4 × 4 patches of 14 px, 2 × 2 merged = 4 image tokens by hand). The CPU
    probe's peak is the real trainer's tensors, so it lands within 5 % of the real CPU step the trace holds itself to
    (hpcmem.trace.measure_cpu): SFT and DPO a little above it (the next micro-batch, which the probe's meter counts and
    measure_cpu leaves on the host), GRPO a little below (its probe generates where measure_cpu takes fixed
    completions)."""
    from hpcmem.record import read_records
    from hpcmem.trace import measure_cpu

    out = tmp_path / "cpu.jsonl"
    proc = subprocess.run([sys.executable, "-m", "hpcmem.probe.matrix", "--device", "cpu", "--tiny", "--steps", "2",
                           "--only", case, "--out", str(out), "--budget-s", "300"],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (record,) = read_records(out)
    assert record.status == "ok" and record.cell == cell
    train = record.job["train"]
    assert (train["images_per_example"], train["image_height"], train["image_width"]) == (1, 56, 56)
    assert record.estimate["vision"]["tokens_per_image"] == 4 and record.estimate["vision"]["patches_per_image"] == 16
    job = record.job_spec()                          # the tower spec rebuilt from the record's config.json
    assert job.model.vision.patch_size == 14 and job.model.vision.depth == 2
    config = tmp_path / "tiny.json"                  # the kit's shrunk config, gone with its temporary folder
    config.write_text(json.dumps(record.model_config))
    real = measure_cpu(dataclasses.replace(job, model=dataclasses.replace(job.model, name=str(config))))
    measured = record.measured.peak_allocated_bytes
    assert abs(measured - real.peak_allocated_bytes) <= 0.05 * real.peak_allocated_bytes, (measured, real)

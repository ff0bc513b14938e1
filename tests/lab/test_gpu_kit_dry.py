"""The GPU kit's dry mode end to end: estimator/gpu/run_matrix.sh with KIT_DRY=1 runs every step a lease runs — the
import check, the kit's schedule with each probe's command line parsed by today's `hpcmem probe`, and the allocator
replays with the kit's own options, the stored streams, the allocator model and the files a lease brings back.
No GPU exists here, so torch.cuda itself is stubbed (estimator/gpu/dry_cuda.py, the CUDA boundary only); TRL,
transformers, the CLI and the allocator model are the real ones. ~15 s (four short Python processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MIB = 1024**2


@pytest.mark.torch
def test_the_kit_dry_run_writes_what_a_lease_brings_back(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    from hpcmem.lab.allocator_records import EVENTS, cuda_replay_rows, main, replay_lines, with_models

    env = {**os.environ, "KIT_DRY": "1", "OUT": str(tmp_path), "PYTHON": sys.executable, "HF_HUB_OFFLINE": "1",
           "REPLAY_ONLY": "sft-qwen05-full", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(["bash", "estimator/gpu/run_matrix.sh"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    log = (tmp_path / "kit.log").read_text()
    assert done.returncode == 0, log[-3000:] + done.stderr[-2000:]
    assert "failed steps: none" in log

    plan = json.loads((tmp_path / "kit-schedule.json").read_text())
    assert plan["refused"] == {}                       # today's `hpcmem probe` accepts every case the kit starts
    assert list(plan["steps"]) == ["boundary", "new", "compare", "rest"] and plan["steps"]["boundary"]
    assert plan["gpu"] == "H200"

    # the default allocator's two passes first, then the expandable ones; each line a stream, the GPU's half only
    lines = replay_lines((tmp_path / "allocator-cuda-replay.jsonl").read_text())
    assert all(x["model"] is None for x in lines)
    assert [(x["case"], x["expandable"], x["perturb_bytes"]) for x in lines] == [
        ("sft-qwen05-full", False, 0), ("sft-qwen05-full", False, 2 * MIB), ("sft-qwen05-full", False, 8 * MIB),
        ("sft-qwen05-full", True, 0), ("sft-qwen05-full", True, 2 * MIB), ("sft-qwen05-full", True, 8 * MIB)]
    assert main(["--read", str(tmp_path / "allocator-cuda-replay.jsonl")]) == 0
    rows = {(r["expandable"], r["perturb_bytes"]): r for r in cuda_replay_rows(with_models(lines, EVENTS))}
    # the model's side, replayed at --read, is the model's: one 2 MiB tensor maps the LM head's bf16 [V, H] gradient (151,936 × 896 × 2 B =
    # 259.7 MiB) again in step 2 under the default allocator — 264 MiB, as measured on 2026-12-01 (estimator/LOG.md)
    # — and moves nothing under expandable segments
    assert rows[(False, 2 * MIB)]["model_moved"] == 264 * MIB
    assert rows[(True, 2 * MIB)]["model_moved"] == 0

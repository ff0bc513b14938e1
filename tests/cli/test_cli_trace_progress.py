"""`hpcmem trace` says what it is doing on stderr while it traces (a full-size 70B model takes a minute, and a
command silent for that long looks hung), and nothing with --json, whose stdout stays one JSON object. Tiny Qwen2,
two real CPU steps, twice, in fresh processes as a user runs them (~30 s on two shared cores)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.test_cli_hostile import _tiny_qwen

pytest.importorskip("trl")
pytestmark = pytest.mark.torch
ROOT = Path(__file__).resolve().parents[2]


def test_trace_prints_a_line_per_stage_and_step_on_stderr_but_not_with_json(tmp_path):
    model = str(_tiny_qwen(tmp_path / "m"))
    argv = [sys.executable, "-m", "hpcmem", "trace", "sft", "--model_name_or_path", model, "--max_length", "32",
            "--per_device_train_batch_size", "2", "--gpu", "H100-80GB"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("trace: ")]
    assert [line.split(" ")[1] for line in lines] == ["building", "tracing", "step", "step", "replaying"]
    assert "step 2 of 2 traced" in lines[3]
    quiet = subprocess.run([*argv, "--json"], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert quiet.returncode == 0 and "trace: " not in quiet.stderr
    assert isinstance(json.loads(quiet.stdout), dict)

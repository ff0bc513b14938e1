"""The README's first worked example is what the command prints today: `hpcmem estimate` on the shipped example (the
main job `make run` runs), line for line. An estimator change that moves it must move the README with it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LEAD = "The first one prints (the example file sets `gpu: H100-80GB`):\n\n```\n"


def test_the_readme_shows_what_the_main_job_prints() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    start = readme.index(LEAD) + len(LEAD)
    shown = readme[start:readme.index("\n```\n", start)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
    run = subprocess.run([sys.executable, "-m", "hpcmem", "estimate", "sft", "--config",
                          "hpcmem/examples/sft-qwen2.5-7b-lora.yaml"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    printed = [line.rstrip() for line in run.stdout.rstrip("\n").splitlines()]
    assert shown.splitlines() == printed

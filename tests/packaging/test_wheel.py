"""The built wheel, installed with its core dependencies only (no torch) into a fresh venv outside the checkout,
is calibrated: the calibrations ship as package data, and an estimate there says "calibrated" for the H200."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def _run(argv: list[str], **kw) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, **kw)
    assert done.returncode == 0, f"{argv[:4]}…\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    return done


def test_installed_wheel_is_calibrated_outside_the_checkout(tmp_path: Path) -> None:
    pytest.importorskip("hatchling", reason="the [test] extra builds the wheel without build isolation")
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
          str(tmp_path / "dist"), str(ROOT)])
    wheel = next((tmp_path / "dist").glob("hpcmem-*.whl"))
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    _run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(wheel)])
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HPCMEM_DATA", "HPCMEM_ESTIMATOR_DIR")}
    env.update(XDG_CONFIG_HOME=str(tmp_path / "xdg"), HF_HUB_OFFLINE="1")        # no site data of this machine
    out = _run([str(venv / "bin" / "hpcmem"), "estimate", "sft", "--model_name_or_path", "Qwen/Qwen2.5-7B", "--gpu",
                "H200", "--json"], cwd=tmp_path, env=env)
    verdict = json.loads(out.stdout)["verdict"]
    assert verdict["calibration"]["status"] == "calibrated" and verdict["calibration"]["gpu"] == "H200"
    assert verdict["coverage"] is not None and verdict["capacity_bytes"] == 150_109_880_320
    where = _run([str(venv / "bin" / "python"), "-c",
                  "import hpcmem, importlib.util as u; print(hpcmem.__file__); print(u.find_spec('torch') is None)"],
                 cwd=tmp_path, env=env).stdout.split()
    assert where[0].startswith(str(venv)) and where[1] == "True"      # the installed copy, and no torch there
    # the light install has no matplotlib: a picture is refused in one line that says how to get it, no traceback
    pic = subprocess.run([str(venv / "bin" / "hpcmem"), "estimate", "sft", "--model_name_or_path", "Qwen/Qwen2.5-7B",
                          "--gpu", "H200", "--plot", str(tmp_path / "e.png")], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert pic.returncode == 2 and not (tmp_path / "e.png").exists()
    assert len(pic.stderr.strip().splitlines()) == 1 and "matplotlib" in pic.stderr and "Traceback" not in pic.stderr
    # commands that need torch or datasets say which extra to install, in one line, before writing anything
    xdg = tmp_path / "xdg"
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "hello"}\n')
    for argv, module in ((["models", "learn", "openai/gpt-oss-20b"], "torch"),
                         (["trace", "sft", "--model_name_or_path", "Qwen/Qwen2.5-0.5B"], "torch"),
                         (["probe", "sft", "--model_name_or_path", "Qwen/Qwen2.5-0.5B"], "torch"),
                         (["lengths", str(data), "--tokenizer", "Qwen/Qwen2.5-0.5B"], "datasets"),
                         (["lengths", str(data), "--trainer", "kto", "--tokenizer", "x"], "datasets")):
        done = subprocess.run([str(venv / "bin" / "hpcmem"), *argv], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 2, (argv, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1 and f"needs {module}" in done.stderr, (argv, done.stderr)
        assert "hpcmem[train]" in done.stderr and "Traceback" not in done.stderr
    assert not (xdg / "hpcmem").exists()          # models learn made no profiles folder
    # the coverage table from the wheel shows the sweep's measured error (its summary ships with the package)
    cov = json.loads(_run([str(venv / "bin" / "hpcmem"), "models", "coverage", "--json"], cwd=tmp_path,
                          env=env).stdout)
    llama = next(r for r in cov if r["model_type"] == "llama")
    assert llama["measured"] is not None and llama["measured"]["max_abs_err_pct"] < 3

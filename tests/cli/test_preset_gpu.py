"""`--preset` sets the GPU for estimate and plan as submit runs the job: the preset's GPU, even when the --config YAML
names another (`gpu:` in hpcmem/examples/sft-qwen2.5-7b-lora.yaml is H100-80GB; example-l40s runs on L40S nodes).
A command-line --gpu still overrides it for estimate (its --help says so)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from click.testing import CliRunner

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = str(ROOT / "hpcmem/examples/sft-qwen2.5-7b-lora.yaml")
PRESET = ROOT / "hpcmem/presets/example-l40s.yaml"


def _cli(args: list[str]):
    from hpcmem.cli import cli

    return CliRunner().invoke(cli, args)


def _preset_gpu() -> str:
    return yaml.safe_load(PRESET.read_text())["gpu"]


def test_example_config_names_another_gpu_than_the_preset():
    """The premise: the YAML and the preset disagree, so the tests below can tell which one won."""
    assert yaml.safe_load(Path(EXAMPLE).read_text())["gpu"] != _preset_gpu()


def test_estimate_with_preset_uses_the_preset_gpu_over_the_config_key():
    res = _cli(["estimate", "sft", "--config", EXAMPLE, "--preset", "example-l40s", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["gpu"]["name"] == _preset_gpu()


def test_estimate_gpu_flag_still_overrides_the_preset():
    res = _cli(["estimate", "sft", "--config", EXAMPLE, "--preset", "example-l40s", "--gpu", "H200", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["gpu"]["name"] == "H200"


def test_plan_with_preset_plans_on_the_preset_gpu():
    res = _cli(["plan", "sft", "--config", EXAMPLE, "--preset", "example-l40s", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["gpu"] == _preset_gpu()


def test_estimate_with_preset_agrees_with_submit_dry_run(tmp_path):
    """Same job, same preset: the device peak estimate prints and the one submit checks are the same number."""
    est = _cli(["estimate", "sft", "--config", EXAMPLE, "--preset", "example-l40s", "--json"])
    sub = _cli(["submit", "sft", "--config", EXAMPLE, "--preset", "example-l40s", "--dry-run",
                "--runs-dir", str(tmp_path)])
    assert est.exit_code == 0 and sub.exit_code == 0, (est.output, sub.output)
    stored = json.loads(next(tmp_path.glob("*/estimate.json")).read_text())
    assert stored["gpu"]["name"] == _preset_gpu()
    assert json.loads(est.output)["per_gpu"]["device_peak_bytes"] == stored["per_gpu"]["device_peak_bytes"]

"""A job with images runs with the image bounds its estimate assumed. TRL's trainers load the processor with
`AutoProcessor.from_pretrained(model)` and nothing else (trl/trainer/sft_trainer.py), so `submit` writes
`trl_entry.py` and `processor.json` and launches the TRL script through them. Held here: the script's launch line, the
real transformers processor that TRL's own module name resolves to, resizing a picture as a hand calculation of
transformers' smart_resize says, and TRL's real script parser reached through the entry."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hpcmem.cli import run

pytest.importorskip("trl")
pytestmark = pytest.mark.torch
FIXTURE = Path(__file__).parents[1] / "fixtures" / "vlm" / "Qwen2.5-VL-7B-Instruct.json"
MAX_PIXELS = 28 * 28 * 256           # 200,704: a 1000 × 800 picture (800,000 px) is scaled down


def _submit(tmp_path: Path, capsys, *extra: str) -> tuple[Path, str]:
    model = tmp_path / "qwen25vl"
    model.mkdir(exist_ok=True)
    shutil.copy(FIXTURE, model / "config.json")
    runs = tmp_path / "runs"
    assert run(["submit", "sft", "--model_name_or_path", str(model), "--use_peft", "true", "--lora_target_modules",
                "all-linear", "--dtype", "bfloat16", "--max_length", "2048", "--per_device_train_batch_size", "1",
                *extra, "--preset", "example-l40s", "--dry-run", "--runs-dir", str(runs)]) == 0
    out = capsys.readouterr().out
    return max(runs.iterdir()), out


def test_a_job_with_images_launches_trl_through_the_entry_with_its_bounds(tmp_path, capsys):
    folder, out = _submit(tmp_path, capsys, "--images_per_example", "1", "--image_height", "800", "--image_width",
                          "1000", "--max_pixels", str(MAX_PIXELS))
    assert json.loads((folder / "processor.json").read_text()) == {
        "size": {"shortest_edge": 56 * 56, "longest_edge": MAX_PIXELS}}     # min: the class default, 3,136
    script = (folder / "job.sbatch").read_text()
    assert f"{folder}/trl_entry.py trl.scripts.sft --config {folder}/trl.yaml" in script
    assert "--module trl.scripts.sft" not in script
    assert "images: resized into [3,136, 200,704] pixels" in out


def test_a_text_job_launches_trls_module_directly(tmp_path, capsys):
    folder, _ = _submit(tmp_path, capsys)
    assert not (folder / "processor.json").exists() and not (folder / "trl_entry.py").exists()
    assert "--module trl.scripts.sft --config" in (folder / "job.sbatch").read_text()


def _load_entry(path: Path):
    spec = importlib.util.spec_from_file_location("trl_entry_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_entry_makes_trls_processor_resize_as_the_estimate_assumed(tmp_path, capsys):
    from PIL import Image

    from tests.helpers.grid_processor import save_grid_processor
    import trl.trainer.sft_trainer as sft_trainer

    folder, _ = _submit(tmp_path, capsys, "--images_per_example", "1", "--image_height", "800", "--image_width",
                        "1000", "--max_pixels", str(MAX_PIXELS))
    # the checkpoint's own preprocessor config allows 28·28·1280 pixels: 1000 × 800 would stay 1008 × 812
    proc_dir = save_grid_processor(str(tmp_path / "proc"), min_pixels=56 * 56, max_pixels=28 * 28 * 1280)
    picture = Image.new("RGB", (1000, 800))
    before = sft_trainer.AutoProcessor.from_pretrained(proc_dir).image_processor(picture)["image_grid_thw"]
    assert before.tolist() == [[1, 58, 72]]            # round(800/28)·28 = 812 → 58 patches; round(1000/28)·28 = 1008
    original = sft_trainer.AutoProcessor.from_pretrained
    try:
        entry = _load_entry(folder / "trl_entry.py")
        entry.install(json.loads((folder / "processor.json").read_text()))
        after = sft_trainer.AutoProcessor.from_pretrained(proc_dir).image_processor(picture)["image_grid_thw"]
    finally:
        sft_trainer.AutoProcessor.from_pretrained = original
    # by hand: 800,000 > 200,704 → β = √(800,000 / 200,704) = 1.9965; 800/β/28 = 14.31 → 14·28 = 392 (28 patches);
    # 1000/β/28 = 17.89 → 17·28 = 476 (34 patches)
    assert after.tolist() == [[1, 28, 34]]


def test_the_entry_hands_the_arguments_to_trls_script(tmp_path, capsys):
    folder, _ = _submit(tmp_path, capsys, "--images_per_example", "1", "--image_height", "448", "--image_width", "448")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, str(folder / "trl_entry.py"), "trl.scripts.sft", "--help"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "--max_length" in done.stdout and "--dataset_name" in done.stdout       # TRL's SFT parser answered
    bad = subprocess.run([sys.executable, str(folder / "trl_entry.py")], capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "usage:" in bad.stderr and bad.stderr.count("\n") == 1


def test_a_fixed_resize_processor_gets_no_bounds(tmp_path, capsys):
    """Gemma 3's processor resizes every image to its checkpoint's one size: nothing to hand over, TRL's module runs."""
    runs = tmp_path / "runs"
    assert run(["submit", "sft", "--model_name_or_path", "google/gemma-3-4b-it", "--use_peft", "true",
                "--lora_target_modules", "all-linear", "--dtype", "bfloat16", "--max_length", "1024",
                "--per_device_train_batch_size", "1", "--images_per_example", "1", "--image_height", "640",
                "--image_width", "480", "--preset", "example-l40s", "--dry-run", "--runs-dir", str(runs)]) == 0
    capsys.readouterr()
    folder = max(runs.iterdir())
    assert not (folder / "processor.json").exists() and not (folder / "trl_entry.py").exists()
    assert "--module trl.scripts.sft --config" in (folder / "job.sbatch").read_text()

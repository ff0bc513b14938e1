"""A vision-language job launches as TRL reads it: `submit --dry-run` and `plan` on a Qwen2.5-VL SFT job with images
write a TRL YAML that TRL's own sft script parser takes with nothing left over, and hpcmem's image description
(images per example, size, the processor's pixel bounds) stays out of it: TRL 1.16's SFTConfig has no such fields."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from hpcmem.cli import run

trl_sft = pytest.importorskip("trl.scripts.sft")
FIXTURE = Path(__file__).parents[1] / "fixtures" / "vlm" / "Qwen2.5-VL-7B-Instruct.json"
IMAGE_FIELDS = ("images_per_example", "image_height", "image_width", "min_pixels", "max_pixels")


def _model(tmp_path: Path) -> str:
    folder = tmp_path / "qwen25vl"
    folder.mkdir()
    shutil.copy(FIXTURE, folder / "config.json")
    return str(folder)


def _job(model: str, images: bool = True) -> list[str]:
    pictures = ["--images_per_example", "2", "--image_height", "448", "--image_width", "640", "--max_pixels",
                "401408"] if images else []
    return ["sft", "--model_name_or_path", model, *pictures, "--use_peft", "true", "--lora_target_modules",
            "all-linear", "--dtype", "bfloat16", "--max_length", "2048", "--per_device_train_batch_size", "2"]


def test_submit_dry_run_writes_a_yaml_trls_sft_parser_takes(tmp_path, capsys):
    runs = tmp_path / "runs"
    assert run(["submit", *_job(_model(tmp_path)), "--preset", "example-l40s", "--dry-run",
                "--runs-dir", str(runs)]) == 0
    capsys.readouterr()
    path = next(runs.iterdir()) / "trl.yaml"
    data = yaml.safe_load(path.read_text())
    assert not set(IMAGE_FIELDS) & set(data)
    # the dataset and precision a CPU parse needs come from the command line, as a user adds their own fields
    *parsed, config_left, cli_left = trl_sft.make_parser().parse_args_and_config(
        ["--config", str(path), "--dataset_name", "HuggingFaceH4/llava-instruct-mix-vsft", "--use_cpu", "true",
         "--bf16", "false", "--report_to", "none"], return_remaining_strings=True, separate_remaining_strings=True)
    assert config_left == [] and cli_left == []
    by_name = {k: v for obj in parsed for k, v in vars(obj).items()}
    assert (by_name["max_length"], by_name["per_device_train_batch_size"], by_name["use_peft"]) == (2048, 2, True)
    assert by_name["lora_target_modules"] in ("all-linear", ["all-linear"])


def test_plan_on_an_image_job_offers_plans_with_the_images_kept(tmp_path, capsys):
    model = _model(tmp_path)
    assert run(["plan", *_job(model), "--gpu", "L40S", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["plans"], out
    # TRL's vision collator neither packs nor goes padding-free (both raise with images): only padded plans
    assert {p["knobs"]["pack"] for p in out["plans"]} == {"padded"}
    # the images are in every plan's memory: the same job without them needs less at the same knobs
    # the first plan's memory is the image job's own: `hpcmem estimate` of it at the plan's knobs gives the same peak
    top = out["plans"][0]
    k = top["knobs"]
    assert (k["gc"], k["sharding"], k["activation_offloading"], k["optim"]) == ("full", "ddp", False, "adamw_torch_fused")
    argv = [*_job(model), "--per_device_train_batch_size", str(k["batch"]), "--gradient_accumulation_steps",
            str(k["accum"]), "--gradient_checkpointing", "true", "--expandable_segments", str(k["expandable_segments"]),
            "--optim", k["optim"], "--gpu", "L40S", "--json"]
    assert run(["estimate", *argv]) == 0
    est = json.loads(capsys.readouterr().out)["per_gpu"]
    assert est["device_peak_bytes"] == top["device_peak_bytes"]
    assert any(name.startswith("vision") for name in est["components"])

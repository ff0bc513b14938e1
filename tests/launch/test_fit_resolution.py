"""A vision-language job that does not fit is offered, last, the largest max_pixels at which it fits as given.
Held here: the offer is the boundary (the job with that bound fits, one image token more per image does not, both by
`hpcmem estimate`'s own verdict on the command line), and its token count is transformers' smart_resize worked by hand."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

from hpcmem.cli import run

FIXTURE = Path(__file__).parents[1] / "fixtures" / "vlm" / "Qwen2.5-VL-7B-Instruct.json"
UNIT = 28 * 28          # one image token: (patch 14 · merge 2)²


def _job(model: str) -> list[str]:
    return ["sft", "--model_name_or_path", model, "--dtype", "bfloat16", "--per_device_train_batch_size", "1",
            "--max_length", "24000", "--gradient_checkpointing", "true", "--images_per_example", "4",
            "--image_height", "2048", "--image_width", "2048", "--max_pixels", "12845056", "--use_peft", "true",
            "--lora_target_modules", "all-linear"]


def _verdict(argv: list[str], capsys) -> str:
    assert run(["estimate", *argv, "--gpu", "L40S", "--json"]) == 0
    return json.loads(capsys.readouterr().out)["verdict"]["level"]


def test_the_resolution_offered_is_the_largest_that_fits(tmp_path, capsys):
    model = tmp_path / "qwen25vl"
    model.mkdir()
    shutil.copy(FIXTURE, model / "config.json")
    code = run(["submit", *_job(str(model)), "--preset", "example-l40s", "--dry-run", "--runs-dir",
                str(tmp_path / "runs")])
    out = capsys.readouterr()
    assert code != 0, out.out                  # "tight" at the job's own bounds: refused, with its changes
    line = next(x for x in (out.out + out.err).splitlines() if x.strip().startswith("--max_pixels"))
    offered = int(re.search(r"--max_pixels (\d+)", line).group(1))
    tokens = int(re.search(r"at most (\d+) image tokens", line).group(1))
    # smart_resize by hand: a 2048² image above max_pixels is scaled by β = √(2048² / max_pixels), sides floored to 28
    side = math.floor(2048 / math.sqrt(2048 * 2048 / offered) / 28) * 28
    assert tokens == (side // 28) ** 2
    argv = _job(str(model))
    at = argv.index("12845056")
    assert _verdict([*argv[:at], str(offered), *argv[at + 1:]], capsys) == "fits"
    assert _verdict([*argv[:at], str(offered + UNIT), *argv[at + 1:]], capsys) != "fits"

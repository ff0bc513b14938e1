"""A vision-language estimate from an image-text length profile (`hpcmem lengths DATA --processor DIR --save`, then
`hpcmem estimate --lengths`): the profile shipped in tests/fixtures/vlm (4 drawn conversations, made by the real
processor in tests/data/test_lengths_vision.py) gives the worst micro-batch's images, patches and image tokens.

Known answers by hand (Qwen2-VL's resize rule, 14-pixel patches merged 2 × 2; the arithmetic is in
tests/data/test_lengths_vision.py): images A 8 tokens, B 60, C 6; at 2 rows per micro-batch in dataset order the
micro-batches hold [A], [A, B] then [C], [] — 3 images, 8 + 8 + 60 = 76 image tokens, 4 × 76 = 304 patches."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from hpcmem.estimate import estimate
from hpcmem.estimate.lora import lora_layout
from hpcmem.estimate.vision import ACTIVATIONS, GRADIENTS, WEIGHTS, vision_terms
from hpcmem.job.shape import precision
from hpcmem.job.trl_config import build_job
from tests.helpers.cli_main import run_main

ROOT = Path(__file__).resolve().parents[2]
MODEL = str(ROOT / "tests" / "fixtures" / "vlm" / "Qwen2.5-VL-7B-Instruct.json")
PROFILE = str(ROOT / "tests" / "fixtures" / "vlm" / "profile-drawn-sft.json")
ARGS = ["estimate", "sft", "--model_name_or_path", MODEL, "--dtype", "bfloat16", "--per_device_train_batch_size", "2",
        "--max_length", "1024", "--gradient_checkpointing", "true", "--lengths", PROFILE, "--gpu", "H100-80GB"]


def _vision(est) -> dict[str, int]:
    """The vision tower's components at the device peak's phase, by name."""
    peak = max(est.phases, key=lambda p: p.bytes)
    return {c.name: c.bytes for c in peak.components if c.name in (WEIGHTS, ACTIVATIONS, GRADIENTS)}


def test_the_profile_gives_the_worst_micro_batch_images(capsys):
    code, out, err = run_main([*ARGS, "--json"], capsys)
    assert code == 0, err
    vision = json.loads(out)["vision"]
    assert (vision["images_per_micro_batch"], vision["image_tokens_per_micro_batch"],
            vision["patches_per_micro_batch"]) == (3, 76, 304)
    assert vision["source"] == "length profile"
    code, out, err = run_main(ARGS, capsys)
    assert code == 0 and "images from the length profile" in out and "304 patches" in out, out
    assert "images_per_example 0" not in out        # not taken for a text-only job


def test_the_towers_terms_are_those_of_the_same_patches_given_as_images():
    """The same 304 patches and 76 image tokens as 2 rows × 1 image of 56 × 532 px (2 × 19 tokens, 152 patches each:
    no rescale inside the default pixel bounds) give the same tower terms (weights, gradients, states, saved
    activations, backward temporaries) in full fine-tuning, where nothing of the tower depends on the text."""
    common = {"model_name_or_path": MODEL, "dtype": "bfloat16", "per_device_train_batch_size": 2, "max_length": 1024,
              "gradient_checkpointing": True}
    from_profile, _ = build_job("sft", {**common, "profile_images": 3, "profile_patches": 304,
                                        "profile_image_tokens": 76, "tokens_per_micro_batch": 2 * 82})
    as_images, _ = build_job("sft", {**common, "images_per_example": 1, "image_height": 56, "image_width": 532})

    def terms(job):
        return vision_terms(job, precision(job), lora_layout(job))

    assert terms(as_images).patches == 304 and terms(as_images).image_tokens == 76
    assert terms(from_profile) == terms(as_images)
    assert _vision(estimate(from_profile))[WEIGHTS] == 2 * from_profile.model.vision.num_params


def test_refusals_name_the_conflict(capsys):
    code, _, err = run_main([*ARGS, "--images_per_example", "1", "--image_height", "448", "--image_width", "448"],
                            capsys)
    assert code != 0 and "give one of them" in err and err.count("\n") == 1, err
    code, _, err = run_main([*ARGS[:-4], "--max_length", "32", "--lengths", PROFILE], capsys)
    assert code != 0 and "cuts into the image tokens" in err and err.count("\n") == 1, err
    code, _, err = run_main([*ARGS, "--profile_images", "3"], capsys)
    assert code != 0 and "both give the images' counts" in err and err.count("\n") == 1, err
    code, _, err = run_main(["estimate", "dpo", *ARGS[2:]], capsys)
    assert code != 0 and "SFT only" in err and err.count("\n") == 1, err


def test_the_profiles_pixel_bounds_are_the_jobs(capsys, tmp_path):
    """The profile was made at max_pixels 50,176 (its vision block says so): its counts hold only there, so the job
    takes those bounds — a submitted run resizes into them — and another --max_pixels is refused in one line."""
    made = json.loads(Path(PROFILE).read_text())["vision"]
    assert (made["min_pixels"], made["max_pixels"]) == (3136, 50176)
    model = tmp_path / "qwen25vl"      # a job loads its model from a folder
    model.mkdir()
    shutil.copy(MODEL, model / "config.json")
    argv = ["submit", *ARGS[1:-2], "--lora_target_modules", "all-linear", "--preset", "example-l40s", "--dry-run",
            "--runs-dir", str(tmp_path / "runs")]     # the preset trains LoRA
    argv[argv.index(MODEL)] = str(model)
    code, _, err = run_main(argv, capsys)
    assert code == 0, err
    written = json.loads((next((tmp_path / "runs").iterdir()) / "processor.json").read_text())
    assert written == {"size": {"shortest_edge": 3136, "longest_edge": 50176}}
    code, _, err = run_main([*ARGS, "--max_pixels", "100352"], capsys)
    assert code != 0 and "max_pixels 100352 differs from the 50176" in err and err.count("\n") == 1, err
    code, _, err = run_main([*ARGS, "--max_pixels", "50176"], capsys)
    assert code == 0, err

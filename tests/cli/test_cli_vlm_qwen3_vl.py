"""`hpcmem estimate` on Qwen3-VL-8B-Instruct by hub id, offline (the catalog's config): one 448×448 image per row
prints the tower's components, its size and its deepstack mergers' counted by hand from the published config, and the
16 px patch geometry (sides rounded to multiples of 32)."""

from __future__ import annotations

import json

from tests.helpers.cli_main import run_main

HUB_ID = "Qwen/Qwen3-VL-8B-Instruct"
JOB = ["--images_per_example", "1", "--image_height", "448", "--image_width", "448", "--dtype", "bfloat16",
       "--max_length", "2048", "--per_device_train_batch_size", "2", "--gpu", "H200"]


def qwen3_vl_parts() -> tuple[int, int, int]:
    """(tower, merger, deepstack mergers) by hand from Qwen3-VL-8B-Instruct's vision_config (hidden_size 1152, depth 27,
    intermediate_size 4304, 16 px patches × 2 frames × 3 channels, 2,304 learned positions, out_hidden_size 4096,
    deepstack_visual_indexes [8, 16, 24]) and modeling_qwen3_vl.py's modules: Conv3d with bias and the position
    table; per block two LayerNorms (weight + bias), qkv, proj, linear_fc1, linear_fc2 with biases; the merger's
    LayerNorm over the width and two linears; each deepstack merger's LayerNorm over 4 × the width and two linears."""
    h, i, m, out = 1152, 4304, 4 * 1152, 4096
    embed = 3 * 2 * 16 * 16 * h + h + 2304 * h
    block = 2 * 2 * h + (h * 3 * h + 3 * h) + (h * h + h) + (h * i + i) + (i * h + h)
    linears = (m * m + m) + (m * out + out)
    return embed + 27 * block, 2 * h + linears, 3 * (2 * m + linears)


def test_qwen3_vl_by_hub_id_prints_the_vision_components(capsys):
    code, out, err = run_main(["estimate", "sft", "--model_name_or_path", HUB_ID, *JOB], capsys)
    assert code == 0, err
    assert "language model 8.19 B, vision tower + mergers 0.58 B" in out      # the model card's 8.77 B in all
    assert "448×448 px → 448×448 (784 patches, 196 image tokens each" in out
    for name in ("vision tower weights", "vision tower optimizer states", "vision tower gradients",
                 "backward (vision tower)"):
        assert name in out, name
    code, out, err = run_main(["estimate", "sft", "--model_name_or_path", HUB_ID, *JOB, "--use_peft", "true",
                               "--lora_target_modules", "all-linear"], capsys)
    assert code == 0, err
    # qkv, proj, linear_fc1, linear_fc2, and the merger's and the deepstack mergers' two each
    assert "frozen; LoRA on 8 of its linear kinds" in out
    assert "1,568 patches → 392 image tokens" in out
    code, out, err = run_main(["estimate", "sft", "--model_name_or_path", HUB_ID, *JOB, "--json"], capsys)
    assert code == 0, err
    vision = json.loads(out)["vision"]
    assert vision["model_type"] == "qwen3_vl"
    assert (vision["tower_params"], vision["merger_params"], vision["deepstack_merger_params"]) == qwen3_vl_parts()
    assert vision["deepstack_visual_indexes"] == [8, 16, 24]
    assert (vision["patches_per_image"], vision["tokens_per_image"], vision["resized"]) == (784, 196, [448, 448])


def test_a_side_off_the_32_px_grid_is_rounded_as_smart_resize_rounds_it(capsys):
    """500 × 300 px: round(500 / 32) · 32 = 512, round(300 / 32) · 32 = 288 → 32 × 18 patches of 16 px, 144
    tokens."""
    job = [*JOB[:2], "--image_height", "500", "--image_width", "300", *JOB[6:], "--json"]
    code, out, err = run_main(["estimate", "sft", "--model_name_or_path", HUB_ID, *job], capsys)
    assert code == 0, err
    vision = json.loads(out)["vision"]
    assert (vision["resized"], vision["image_grid_thw"], vision["tokens_per_image"]) == ([512, 288], [1, 32, 18], 144)


def test_another_trainer_with_images_is_refused_for_qwen3_vl(capsys):
    code, _, err = run_main(["estimate", "kto", "--model_name_or_path", HUB_ID, *JOB], capsys)
    assert code == 2 and "images_per_example 1 with trainer kto" in err and err.count("\n") == 1


def test_small_images_without_pixel_bounds_are_warned_about(capsys):
    """224 × 224 px = 50,176 pixels: the class default min_pixels (3,136) keeps 224 × 224 (49 tokens), the published
    Qwen3-VL processor's 65,536 scales it up: √(65,536 / 50,176) · 224 = 256 → 256 × 256 (by hand: 64 tokens).
    Given those bounds, the estimate resizes as that processor does and says nothing."""
    small = [*JOB[:2], "--image_height", "224", "--image_width", "224", *JOB[6:]]
    code, out, err = run_main(["estimate", "sft", "--model_name_or_path", HUB_ID, *small], capsys)
    assert code == 0, err
    assert "resize 224×224 px to 224×224" in out + err and "makes it 256×256" in out + err
    code, out, err = run_main(["estimate", "sft", "--model_name_or_path", HUB_ID, *small, "--min_pixels", "65536",
                               "--max_pixels", "16777216", "--json"], capsys)
    assert code == 0, err
    vision = json.loads(out)["vision"]
    assert (vision["resized"], vision["tokens_per_image"]) == ([256, 256], 64)
    assert not any("published" in w for w in json.loads(out)["warnings"])

"""`hpcmem estimate` on the catalog's vision-language models by hub id, offline: Qwen2-VL-7B-Instruct (and
Qwen2.5-VL-7B-Instruct) with one 448×448 image per row prints the tower's own components, its size counted by hand
from the published config, and the images' geometry; what is not modelled with images is refused in the same words
for both types."""

from __future__ import annotations

import json

import pytest

from tests.helpers.cli_main import run_main

JOB = ["--images_per_example", "1", "--image_height", "448", "--image_width", "448", "--dtype", "bfloat16",
       "--max_length", "2048", "--per_device_train_batch_size", "2", "--gpu", "H200"]


def qwen2_vl_tower_params() -> int:
    """By hand from Qwen2-VL-7B-Instruct's vision_config (embed_dim 1280, depth 32, mlp_ratio 4, 14 px patches × 2
    frames × 3 channels, merger 4 · 1280 → 3584) and modeling_qwen2_vl.py's modules: Conv3d without bias; per block
    two LayerNorms (weight + bias), qkv, proj, fc1, fc2 with biases; the merger's LayerNorm and two linears."""
    h, i, m, out = 1280, 5120, 4 * 1280, 3584
    embed = 3 * 2 * 14 * 14 * h
    block = 2 * 2 * h + (h * 3 * h + 3 * h) + (h * h + h) + (h * i + i) + (i * h + h)
    merger = 2 * h + (m * m + m) + (m * out + out)
    return embed + 32 * block + merger


def test_qwen2_vl_by_hub_id_prints_the_vision_components(capsys):
    code, out, err = run_main(["estimate", "sft", "--model_name_or_path", "Qwen/Qwen2-VL-7B-Instruct", *JOB], capsys)
    assert code == 0, err
    assert "language model 7.62 B, vision tower + merger 0.68 B" in out
    assert "448×448 px → 448×448 (1,024 patches, 256 image tokens each" in out
    for name in ("vision tower weights", "vision tower optimizer states", "vision tower gradients",
                 "backward (vision tower)"):
        assert name in out, name
    # LoRA: the peak is a decoder layer's backward, under which the tower's saved activations are alive
    code, out, err = run_main(["estimate", "sft", "--model_name_or_path", "Qwen/Qwen2-VL-7B-Instruct", *JOB,
                               "--use_peft", "true", "--lora_target_modules", "all-linear"], capsys)
    assert code == 0, err
    assert "frozen; LoRA on 6 of its linear kinds" in out          # qkv, proj, fc1, fc2 and the merger's two
    assert "vision activations" in out and "2,048 patches → 512 image tokens" in out
    code, out, err = run_main(["estimate", "sft", "--model_name_or_path", "Qwen/Qwen2-VL-7B-Instruct", *JOB,
                               "--json"], capsys)
    assert code == 0, err
    vision = json.loads(out)["vision"]
    assert vision["model_type"] == "qwen2_vl"
    assert vision["tower_params"] + vision["merger_params"] == qwen2_vl_tower_params() == 675_759_104
    assert (vision["patches_per_image"], vision["tokens_per_image"], vision["patches_per_micro_batch"]) == \
        (1024, 256, 2 * 1024)


@pytest.mark.parametrize("extra", [["--packing", "true"], ["--use_liger_kernel", "true"]])
def test_refusals_read_the_same_for_both_types(extra, capsys):
    said = {}
    for hub_id in ("Qwen/Qwen2-VL-7B-Instruct", "Qwen/Qwen2.5-VL-7B-Instruct"):
        code, _, err = run_main(["estimate", "sft", "--model_name_or_path", hub_id, *JOB, *extra], capsys)
        said[hub_id] = (code, err.replace(hub_id, "MODEL"))
    assert said["Qwen/Qwen2-VL-7B-Instruct"] == said["Qwen/Qwen2.5-VL-7B-Instruct"]
    assert said["Qwen/Qwen2-VL-7B-Instruct"][0] == 2


def test_another_trainer_with_images_is_refused_for_qwen2_vl(capsys):
    code, _, err = run_main(["estimate", "kto", "--model_name_or_path", "Qwen/Qwen2-VL-7B-Instruct", *JOB], capsys)
    assert code == 2 and "images_per_example 1 with trainer kto" in err and err.count("\n") == 1

"""GPUs a site owns (fast tier): a bare size or a description on --gpu and in presets, uncalibrated until a
campaign; the catalog's 2026 additions with their sources; driver names matched as whole words."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from hpcmem.cli import cli, run
from hpcmem.gpus.catalog import catalog_entries, catalog_name_for
from hpcmem.gpus.lookup import gpu_spec

GIB, MIB = 1024**3, 1024**2


def _verdict(*gpu: str) -> dict:
    out = CliRunner().invoke(cli, ["estimate", "grpo", "--model_name_or_path", "Qwen/Qwen2.5-7B", *gpu, "--json"],
                             catch_exceptions=False)
    assert out.exit_code == 0, out.output
    return json.loads(out.output)["verdict"]


@pytest.mark.parametrize("gpu, capacity", [
    ("H20", 97871 * MIB - GIB),          # nvidia-smi's 97,871 MiB less the catalog's derived 1 GiB
    ("96GB", 95 * GIB),                  # a bare size: 96 GiB of memory, 1 GiB less usable
])
def test_a_new_users_gpu_gets_a_verdict_marked_uncalibrated(gpu, capacity):
    v = _verdict("--gpu", gpu)
    # one uncalibrated GPU takes the margin fitted on published single-GPU rows: one source, so nothing was held out
    # and no coverage is claimed
    assert v["capacity_bytes"] == capacity and v["calibration"]["status"] == "published"
    assert v["calibration"]["evidence"] == "published single-GPU rows"
    held = v["calibration"]["held_out"]
    assert held["n"] == 0 and v["coverage"] is None and "derived" in v["calibration"]["note"]
    text = CliRunner().invoke(cli, ["estimate", "grpo", "--model_name_or_path", "Qwen/Qwen2.5-7B", "--gpu", gpu],
                              catch_exceptions=False).output
    assert f"({gpu} uncalibrated" in text


def test_a_description_states_usable_memory_and_round_trips():
    from hpcmem.gpus.describe import parse

    spec = gpu_spec("name=A6000-site,memory=48GB,usable=47.5GiB,cc=8.6,tflops=155")
    assert (spec.name, spec.usable_bytes, spec.memory_bytes) == ("A6000-site", int(47.5 * GIB), 48 * GIB)
    assert (spec.compute_capability, spec.bf16_tflops, spec.calibrated) == ("8.6", 155.0, False)
    described = parse({"name": "A6000-site", "memory_gb": 48, "usable_gb": 47.5, "compute_capability": "8.6",
                       "bf16_tflops": 155})
    assert parse(described.text) == described and gpu_spec(described.text) == spec


@pytest.mark.parametrize("gpu, message", [
    ("name=x,memory=48GB,foo=1", "unknown key foo"),
    ("name=x,usable=40GB", "memory is required"),
    ("name=x,memory=48GB,usable=49GB", "usable must be at most the memory"),
    ("name=x,memory=48GB,cc=sm90", "cc must be a CUDA compute capability"),
    ("name=H100,memory=80GB", "'H100' is in the catalog"),
    ("96 TB", "unknown GPU '96 TB'"),
    ("0GB", "must be a size above 0"),
])
def test_bad_descriptions_are_one_line(capsys, gpu, message):
    assert run(["estimate", "sft", "--model_name_or_path", "Qwen/Qwen2.5-0.5B", "--gpu", gpu]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_a_preset_describes_its_gpu_as_a_mapping():
    from hpcmem.launch.presets import from_dict

    pre = from_dict({"partition": "p", "gpu": {"name": "MI250-site", "memory_gb": 64, "compute_capability":
                                               "gfx90a"}, "gpus_per_node": 4, "cpus_per_node": 32,
                     "max_time": "1:00:00"}, source="s.yaml", default_name="s")
    spec = pre.gpu_spec()
    assert (spec.name, spec.usable_bytes, spec.compute_capability) == ("MI250-site", 63 * GIB, "gfx90a")


@pytest.mark.parametrize("reported, memory, expected", [
    ("NVIDIA GB200", 189471 * MIB, "GB200"),                # not the B200, whose name is inside GB200's
    ("NVIDIA H20", 97871 * MIB, "H20"),                     # not the H200
    ("NVIDIA L40S", 46068 * MIB, "L40S"),                   # not the L4
    ("NVIDIA L20", 46068 * MIB, "L20"),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", 97887 * MIB, "RTX-PRO-6000"),
    ("NVIDIA GeForce RTX 5090", 32607 * MIB, "RTX-5090"),
    ("NVIDIA A800-SXM4-80GB", 81920 * MIB, "A800-80GB"),
])
def test_driver_names_match_catalog_names_as_words(reported, memory, expected):
    assert catalog_name_for(reported, memory) == expected


def test_every_catalog_capacity_cites_its_source_or_says_it_is_derived():
    for e in catalog_entries():
        assert e["capacity_bytes"] <= e["memory_bytes"], e["name"]
        source = e["capacity_source"]
        measured = source.startswith("OOM message") or "total_memory" in source  # PyTorch said it, or torch
        assert source.startswith("derived") if e["capacity_derived"] else measured, e["name"]
    names = {e["name"] for e in catalog_entries()}
    assert {"H20", "H800", "A800-80GB", "L20", "RTX-5090", "RTX-PRO-6000", "B300", "GB200", "MI325X",
            "MI355X"} <= names


def test_every_catalog_gpu_has_a_compute_rate_and_the_v100_its_datasheet_one():
    # NVIDIA Tesla V100 datasheet (V100 SXM2): single precision 15.7 TFLOPS, Tensor Performance 125 TFLOPS — fp16
    # only: Volta (compute capability 7.0) has no bf16 Tensor Cores, so a bf16 job runs at most at the fp32 rate
    assert [e["name"] for e in catalog_entries() if not e["bf16_tflops"] > 0] == []
    assert gpu_spec("V100").bf16_tflops == 15.7


def test_a_bf16_job_on_a_gpu_without_bf16_tensor_cores_is_warned():
    out = CliRunner().invoke(cli, ["estimate", "sft", "--model_name_or_path", "Qwen/Qwen3-0.6B", "--gpu", "V100",
                                   "--json"], catch_exceptions=False)
    assert out.exit_code == 0, out.output
    assert any("no bf16 Tensor Cores" in w for w in json.loads(out.output)["warnings"])
    out = CliRunner().invoke(cli, ["estimate", "sft", "--model_name_or_path", "Qwen/Qwen3-0.6B", "--gpu", "A100",
                                   "--json"], catch_exceptions=False)
    assert not any("bf16 Tensor Cores" in w for w in json.loads(out.output)["warnings"])


def test_an_fp16_job_on_the_v100_is_ranked_with_its_fp16_tensor_core_rate():
    """Same knobs, one GPU, no communication or offload: the step is compute, so fp16 (125 TFLOPS, Tensor Cores) is
    ranked about 125 / 15.7 ≈ 8 times faster than bf16 (emulated, at most the fp32 15.7) — the datasheet's ratio."""
    flags = ["plan", "sft", "--model_name_or_path", "Qwen/Qwen3-0.6B", "--max_length", "1024", "--gpu", "V100",
             "--per_device_train_batch_size", "1", "--gradient_accumulation_steps", "1", "--gradient_checkpointing",
             "true", "--packing", "false", "--accelerate_config", "single_gpu", "--json"]
    step = {}
    for precision in ("bf16", "fp16"):
        out = CliRunner().invoke(cli, [*flags, f"--{precision}", "true"], catch_exceptions=False)
        assert out.exit_code == 0, out.output
        step[precision] = json.loads(out.output)["plans"][0]["step_s"]
    assert 125 / 15.7 * 0.8 < step["bf16"] / step["fp16"] <= 125 / 15.7 * 1.001

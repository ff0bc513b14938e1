"""The job's environment read for its memory effects (hpcmem.job.job_env), held to torch's own parsers and to hand
sums: the allocator settings torch refuses are refused, expandable_segments reaches the estimate, NCCL_NVLS_ENABLE=0
drops NCCL's NVLS buffers, CUBLAS_WORKSPACE_CONFIG sizes cuBLAS's workspaces, and what hpcmem does not model is
named in the estimate."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from hpcmem.cli.options import job_from_cli
from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.job.job_env import CUDA_KEYS, GENERIC_KEYS, read_env

MIB = 1024 * 1024
KIB = 1024
FSDP8 = {"model_name_or_path": "Qwen/Qwen2.5-7B", "gpu": "H100-80GB", "num_processes": 8, "accelerate_config": "fsdp2"}


def _job(env=None, **extra):
    return job_from_cli("sft", {**FSDP8, **extra}, env=env)[0]


def _torch_refuses(value: str) -> bool:
    torch = pytest.importorskip("torch")
    try:
        torch._C._accelerator_setAllocatorSettings(value)
    except (RuntimeError, ValueError):
        return True
    finally:
        torch._C._accelerator_setAllocatorSettings("")
    return False


@pytest.mark.torch
@pytest.mark.parametrize("value", [
    "expandable_segments:True", "expandable_segments:true", "expandable_segments:1", "expandable_segments:False",
    "max_split_size_mb:512", "max_split_size_mb:10", "max_split_size_mb:abc", "garbage_collection_threshold:0.6",
    "garbage_collection_threshold:1.5", "roundup_power2_divisions:4", "max_non_split_rounding_mb:64",
    " expandable_segments : True , max_split_size_mb : 256 ", "large_segment_size_mb:64",
    "pinned_use_background_threads:True", "pinned_use_background_threads:yes"])
def test_generic_allocator_values_are_refused_exactly_where_torch_refuses_them(value):
    """torch 2.13's device-generic parser (the CPU wheel runs it) is the oracle for the generic keys."""
    try:
        read_env({"PYTORCH_ALLOC_CONF": value})
        ours = False
    except SpecError:
        ours = True
    assert ours == _torch_refuses(value), value


@pytest.mark.torch
def test_the_key_sets_are_torchs():
    """Generic keys: torch's parser rejects a bad value for each and ignores an unknown key; CUDA keys: the list in
    the CUDA parser's header torch ships (CUDAAllocatorConfig::getKeys)."""
    torch = pytest.importorskip("torch")
    for key in GENERIC_KEYS:
        assert _torch_refuses(f"{key}:zz"), key
    assert not _torch_refuses("not_a_key_of_torch:zz")
    header = (Path(torch.__file__).parent / "include/c10/cuda/CUDAAllocatorConfig.h").read_text()
    block = header[header.index("getKeys()"):]
    block = block[:block.index("};")]
    # adjacent literals ("release_lock_on_cud" "amalloc") are one key, as C++ joins them
    joined = re.sub(r'"\s*(?://[^\n]*\n\s*)*"', "", re.sub(r"//[^\n]*", "", block))
    assert set(re.findall(r'"([a-z_]+)"', joined)) == set(CUDA_KEYS)


@pytest.mark.parametrize("env, words", [
    ({"PYTORCH_ALLOC_CONF": "exapndable_segments:True"}, ["exapndable_segments", "Unrecognized key"]),
    ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:true"}, ["True or False"]),
    ({"PYTORCH_ALLOC_CONF": "expandable_segments:True", "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512"},
     ["PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "same value"]),
    ({"PYTORCH_ALLOC_CONF": "per_process_memory_fraction:0.5"}, ["per_process_memory_fraction", "preset"]),
    ({"PYTORCH_ALLOC_CONF": "backend:cudaMallocSync"}, ["backend"]),
    ({"PYTORCH_ALLOC_CONF": "expandable_segments"}, ["key:value"]),
    ({"NCCL_NVLS_ENABLE": "off"}, ["NCCL_NVLS_ENABLE", "integer"]),
    ({"CUBLAS_WORKSPACE_CONFIG": "4096x8"}, ["CUBLAS_WORKSPACE_CONFIG", ":SIZE:COUNT"]),
    ({"CUBLAS_WORKSPACE_CONFIG": ":99999999999999999999:8"}, ["CUBLAS_WORKSPACE_CONFIG", "2147483647"]),
])
def test_what_the_job_would_refuse_or_hpcmem_cannot_hold_is_refused_by_name(env, words):
    with pytest.raises(SpecError) as err:
        read_env(env)
    assert all(w in str(err.value) for w in words), str(err.value)


def test_expandable_segments_follows_the_environment_and_a_contrary_flag_is_refused():
    assert _job().expandable_segments is False
    assert _job({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}).expandable_segments is True
    # torch runs without expandable segments whenever the variable is set without it
    assert _job({"PYTORCH_ALLOC_CONF": "garbage_collection_threshold:0.8"}).expandable_segments is False
    with pytest.raises(SpecError, match="expandable_segments is True but"):
        _job({"PYTORCH_ALLOC_CONF": "max_split_size_mb:512"}, expandable_segments=True)
    both = {"PYTORCH_ALLOC_CONF": "expandable_segments:True", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert _job(both).expandable_segments is True
    same = estimate(_job(both))
    assert same.peak_reserved_bytes == estimate(_job(expandable_segments=True)).peak_reserved_bytes


def test_nvls_off_drops_ncclss_buffers():
    """8 H100s on NVSwitch, NCCL 2.29 (torch 2.13): NVLS takes 16 channels × 2 × 1 MiB × 8 heads (a head per GPU)
    = 256 MiB a GPU (nccl/src/transport/nvls.cc, by hand); NCCL_NVLS_ENABLE=0 turns it off."""
    on, off = estimate(_job()), estimate(_job({"NCCL_NVLS_ENABLE": "0"}))
    assert on.device_peak_bytes - off.device_peak_bytes == 16 * 2 * 1 * MIB * 8
    assert on.peak_allocated_bytes == off.peak_allocated_bytes
    assert estimate(_job({"NCCL_NVLS_ENABLE": "2"})).device_peak_bytes == on.device_peak_bytes


@pytest.mark.parametrize("value, per_handle", [(":4096:8", 4096 * KIB * 8), (":4096:2:16:8", 4096 * KIB * 2 + 16 * KIB * 8),
                                                (":16:8", 16 * KIB * 8)])
def test_cublas_workspace_config_sizes_the_two_workspaces(value, per_handle):
    """Two cuBLAS handles (Python's thread and autograd's) each keep one workspace; the H100's default is 32 MiB
    (CublasHandlePool.cpp parseChosenWorkspaceSize, by hand)."""
    base = estimate(_job())
    got = estimate(_job({"CUBLAS_WORKSPACE_CONFIG": value}))
    assert base.peak_allocated_bytes - got.peak_allocated_bytes == 2 * (32 * MIB - per_handle)


def test_what_is_not_modelled_is_named_in_the_estimate():
    est = estimate(_job({"PYTORCH_ALLOC_CONF": "max_split_size_mb:512", "NCCL_BUFFSIZE": "8388608",
                         "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}))
    text = " ".join(est.warnings)
    assert "max_split_size_mb:512" in text and "NCCL_BUFFSIZE" in text and "PYTORCH_NO_CUDA_MEMORY_CACHING" in text
    assert any("max_split_size_mb" in n for n in est.not_modelled)
    quiet = estimate(_job({"HF_HOME": "/scratch/hf", "PYTORCH_ALLOC_CONF": "pinned_use_background_threads:True"}))
    assert not any("environment" in w for w in quiet.warnings)


def test_the_cli_refuses_in_one_line_and_reads_the_presets_env(tmp_path):
    preset = tmp_path / "site.yaml"
    preset.write_text("partition: gpu\ngpu: H100-80GB\ngpus_per_node: 8\ncpus_per_node: 64\nmax_time: '1:00:00'\n"
                      "env: {PYTORCH_CUDA_ALLOC_CONF: 'expandable_segments:True', NCCL_NVLS_ENABLE: '0'}\n")
    base = [sys.executable, "-m", "hpcmem", "estimate", "sft", "--model_name_or_path", "Qwen/Qwen2.5-7B",
            "--num_processes", "8", "--accelerate_config", "fsdp2"]
    bad = subprocess.run([*base, "--gpu", "H100-80GB", "--env", "PYTORCH_ALLOC_CONF=expandable_segments:yes"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    assert "expandable_segments:yes" in bad.stderr
    conflict = subprocess.run([*base, "--preset", str(preset), "--expandable_segments", "false"],
                              capture_output=True, text=True, timeout=120)
    assert conflict.returncode == 2 and "expandable_segments is False but" in conflict.stderr
    ok = subprocess.run([*base, "--preset", str(preset), "--json"], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert "expandable" in ok.stdout and "NCCL NVLS" not in ok.stdout


def test_a_recorded_run_is_read_with_the_same_rules():
    """The generic parser takes PYTORCH_ALLOC_CONF first: expandable segments only where it (or, unset, the CUDA
    variable) says True; a value torch refuses ran nothing."""
    from hpcmem.record import expandable_in_env

    assert expandable_in_env({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    assert not expandable_in_env({"PYTORCH_ALLOC_CONF": "max_split_size_mb:64",
                                  "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    assert not expandable_in_env({"PYTORCH_ALLOC_CONF": "expandable_segments:true"})
    assert not expandable_in_env(None)

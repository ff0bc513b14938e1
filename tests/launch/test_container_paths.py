"""A container preset's job must see every path it reads or writes: a run folder, output_dir or HF_HOME outside the
preset's mounts (and, for apptainer, outside its default binds) is refused before anything is written."""

from __future__ import annotations

import yaml

from hpcmem.cli import run


def _pyxis(tmp_path, mounts):
    doc = {"partition": "gpu", "gpu": "H100-80GB", "gpus_per_node": 8, "cpus_per_node": 64, "max_time": "12:00:00",
           "env": {"HF_HOME": "/shared/hf"},
           "container": {"kind": "pyxis", "image": "nvcr.io/nvidia/pytorch:25.01-py3", "mounts": mounts}}
    path = tmp_path / "pyxis.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def test_hpcmem_mounts_its_run_folder_and_refuses_a_users_path_outside_the_mounts(tmp_path, capsys):
    runs = tmp_path / "runs"
    argv = ["submit", "sft", "--model_name_or_path", "Qwen/Qwen2.5-0.5B", "--dry-run", "--runs-dir", str(runs),
            "--preset", _pyxis(tmp_path, ["/shared"])]
    assert run(argv) == 0
    out = capsys.readouterr().out
    run_dir = next(runs.iterdir())
    assert f"--container-mounts=/shared,{run_dir}:{run_dir}" in out     # the run folder travels in by itself
    assert run([*argv, "--output_dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"output_dir {tmp_path / 'out'} is not visible inside the pyxis container" in err and "/shared" in err
    assert len(list(runs.iterdir())) == 1                              # refused before anything was written
    assert run([*argv, "--output_dir", "/shared/out/llama8b"]) == 0


def test_an_output_dir_outside_apptainers_binds_is_refused(tmp_path, capsys):
    argv = ["submit", "sft", "--model_name_or_path", "Qwen/Qwen2.5-0.5B", "--preset", "example-a100-apptainer",
            "--dry-run", "--runs-dir", str(tmp_path / "runs")]
    assert run([*argv, "--output_dir", "/shared/out/llama8b"]) == 2
    assert "output_dir /shared/out/llama8b is not visible" in capsys.readouterr().err
    assert run([*argv, "--output_dir", "/scratch/out/llama8b"]) == 0

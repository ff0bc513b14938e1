"""The submitit backend at its edges: an sbatch that cannot run is one line with the run folder kept (not submitit's
retries ending in an internal error), and `--dry-run` shows the file submitit itself would submit."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from hpcmem.cli import run

pytest.importorskip("submitit")
SMALL = ["sft", "--model_name_or_path", "Qwen/Qwen2.5-0.5B", "--preset", "example-h100"]


def test_an_sbatch_that_cannot_run_is_one_line_and_the_run_folder_is_kept(tmp_path, monkeypatch, capsys):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / "sbatch"
    stub.write_text("#!/bin/sh\necho 'sbatch: error: slurm_load_partitions: Unable to contact slurm controller' >&2\n"
                    "exit 1\n")
    stub.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    status = run(["submit", *SMALL, "--backend", "submitit", "--runs-dir", str(tmp_path / "runs")])
    err = capsys.readouterr().err.strip()
    assert status == 2 and "\n" not in err and "internal error" not in err, err
    assert "Unable to contact slurm controller" in err and "kept, nothing submitted" in err
    runs = list((tmp_path / "runs").iterdir())
    assert len(runs) == 1 and (runs[0] / "job.sbatch").is_file()


@pytest.mark.skipif(shutil.which("srun") is None, reason="submitit renders its script only where srun exists")
def test_a_submitit_dry_run_shows_submitits_own_script(tmp_path, capsys):
    assert run(["submit", *SMALL, "--backend", "submitit", "--dry-run", "--runs-dir", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    run_dir = next((tmp_path / "runs").iterdir())
    assert "submitit.core._submit" in out and f"#SBATCH --output={run_dir}/submitit/%j/" in out
    assert "#SBATCH --partition=gpu-h100" in out and "export HF_HOME=" in out
    assert Path(run_dir / "job.sbatch").read_text() not in out       # not the sbatch backend's script

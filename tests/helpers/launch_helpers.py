"""Shared builders for the launch tests (fast tier: catalog models, no torch)."""

from __future__ import annotations

import subprocess
from typing import Any

from hpcmem.launch.job import Launch, LaunchOptions
from hpcmem.launch.presets import from_dict
from hpcmem.launch.runfolder import run_files

RUN_DIR = "/shared/runs/demo-20250101-000000"
WORKDIR = "/home/user/project"
PRESET = {
    "partition": "gpu", "gpu": "H100-80GB", "gpus_per_node": 8, "cpus_per_node": 64, "max_time": "1-00:00:00",
    "memory_per_node_gb": 500, "account": "ml", "modules": ["cuda/12.4"],
    "setup": ["source /shared/venvs/trl/bin/activate"],
    "env": {"HF_HOME": "/shared/hf", "HF_HUB_OFFLINE": "1", "NCCL_SOCKET_IFNAME": "ib0"},
}


def preset(**overrides: Any):
    return from_dict({**PRESET, **overrides}, source="site.yaml", default_name="site")


def job(trainer: str = "sft", **settings: Any):
    from hpcmem.cli.options import job_from_cli

    settings.setdefault("model_name_or_path", "Qwen/Qwen2.5-0.5B")
    built, _ = job_from_cli(trainer, settings, preset={"gpu": "H100-80GB"})
    return built


def launch(job_spec=None, preset_spec=None, **options: Any) -> Launch:
    options.setdefault("workdir", WORKDIR)
    options.setdefault("trl_fields", {"model_name_or_path": "Qwen/Qwen2.5-0.5B", "dataset_name": "trl-lib/Capybara"})
    return Launch(job=job_spec or job(), preset=preset_spec or preset(), options=LaunchOptions(**options),
                  run_dir=RUN_DIR)


def files(launch_spec: Launch, output_dir: str | None = None):
    from pathlib import Path

    return run_files(Path(launch_spec.run_dir), deepspeed=launch_spec.job.parallel.deepspeed, output_dir=output_dir)


class Recorder:
    """A fake Runner: records each argv and answers from a table of (argv prefix → CompletedProcess)."""

    def __init__(self, answers: dict[tuple[str, ...], tuple[int, str, str]]):
        self.answers = answers
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str]) -> subprocess.CompletedProcess:
        self.calls.append(list(argv))
        for prefix, (rc, out, err) in self.answers.items():
            if tuple(argv[: len(prefix)]) == prefix:
                return subprocess.CompletedProcess(argv, rc, out, err)
        return subprocess.CompletedProcess(argv, 1, "", f"unexpected command {argv}")

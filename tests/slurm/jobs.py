"""Presets, TRL YAMLs and `hpcmem submit` calls for the slurm tier (tests/launch/test_launch_slurm.py)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import yaml

from tests.slurm.cluster import CPUS_PER_NODE, GPUS_PER_NODE, PARTITION, SlurmCluster

ROOT = Path(__file__).resolve().parents[2]
ENTRY = Path(__file__).resolve().parent / "entry.py"


def write_preset(folder: Path, name: str = "testcluster", **overrides) -> Path:
    """A preset for the private cluster; the venv's bin goes first on PATH, as a site's `setup` line would do."""
    data = {
        "description": "the slurm tier's private cluster (2 nodes × 2 fake GPUs)",
        "partition": PARTITION, "gpu": "L4", "gpus_per_node": GPUS_PER_NODE, "cpus_per_node": CPUS_PER_NODE,
        "max_time": "00:30:00", "max_nodes": 2, "signal_lead_s": 60,
        "setup": [f"export PATH={shlex.quote(str(Path(sys.executable).parent))}:\"$PATH\""],
        # two "nodes" share this machine's cores: one thread per process keeps them from oversubscribing it
        "env": {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HOME": str(folder / "hf-home"),
                "TORCH_EXTENSIONS_DIR": str(folder / "torch-ext")},
    }
    data.update(overrides)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def write_trl_yaml(path: Path, tiny: Path, output_dir: Path, **fields) -> Path:
    data = {
        "model_name_or_path": str(tiny / "model"), "dataset_name": str(tiny / "data"),
        "output_dir": str(output_dir), "use_cpu": True, "bf16": False, "gradient_checkpointing": False,
        "max_length": 32, "per_device_train_batch_size": 2, "max_steps": 6, "save_steps": 3, "logging_steps": 1,
        "report_to": "none", "dataloader_num_workers": 0, "seed": 0,
    }
    data.update(fields)
    data = {k: v for k, v in data.items() if v is not None}    # None: leave the field out (GRPOConfig has no max_length)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def hpcmem_submit(cluster: SlurmCluster, trainer: str, *args: str, cwd: Path, check: bool = True
                  ) -> subprocess.CompletedProcess:
    """`python -m hpcmem submit …` with the cluster's SLURM_CONF, as a user would run it."""
    env = {**cluster.env, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "hpcmem", "submit", trainer, *args, "--json"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)
    if check and done.returncode != 0:
        raise AssertionError(f"hpcmem submit failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done


def submitted(done: subprocess.CompletedProcess) -> dict:
    return json.loads(done.stdout)


def wait_for(predicate, timeout_s: float, what: str, cluster: SlurmCluster, interval_s: float = 0.5):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise TimeoutError(f"waited {timeout_s:.0f} s for {what}:\n{cluster.logs()}")


def run_logs(run_dir: str | os.PathLike) -> str:
    logs = Path(run_dir) / "logs"
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')}" for p in sorted(logs.glob("*.log")))

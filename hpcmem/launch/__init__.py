"""Launch TRL jobs on SLURM: admin presets, pure renderers (accelerate, DeepSpeed, FSDP, TRL YAML, sbatch), the run
folder and the backends (dry-run, sbatch, submitit). `submit(job, preset, options)` is the Python entry point.

The names below load on first use (PEP 562): `hpcmem estimate` and `hpcmem plan` name them as `launch.<name>` and
load the presets and the submission machinery (run folders, backends, subprocess) only with --preset."""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {"DoesNotFit": ("submission", "DoesNotFit"), "Launch": ("job", "Launch"),
            "LaunchOptions": ("job", "LaunchOptions"), "Prepared": ("submission", "Prepared"),
            "Preset": ("presets", "Preset"), "Submission": ("submission", "Submission"),
            "load_preset": ("presets", "load"), "preset_settings": ("presets", "preset_settings"),
            "prepare": ("submission", "prepare"), "submit": ("submission", "submit")}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'hpcmem.launch' has no attribute {name!r}")
    module, attr = _EXPORTS[name]
    value = getattr(import_module(f"hpcmem.launch.{module}"), attr)
    globals()[name] = value
    return value

"""What the light install lacks: the libraries of the [train] extra, and the one line that says which to install."""

from __future__ import annotations

import importlib.util

from hpcmem.errors import HpcmemError

# The libraries of the [train] extra (pyproject.toml): a command that needs one on the light install is told so.
EXTRAS = {"torch": "train", "transformers": "train", "trl": "train", "peft": "train", "accelerate": "train",
          "datasets": "train", "deepspeed": "train", "matplotlib": "train", "safetensors": "train",
          "tokenizers": "train"}


GROUPS = ("models", "validate", "presets", "gpus")      # commands whose first word names a subcommand


def missing_extra(module: str, args: list[str]) -> str:
    words = [a for a in args[:2] if not a.startswith("-")]
    command = " ".join(words if words[:1] and words[0] in GROUPS else words[:1])
    return (f"`hpcmem {command}` needs {module}, which this install does not have: install the "
            f"[{EXTRAS[module]}] extra (pip install 'hpcmem[{EXTRAS[module]}]'); `hpcmem estimate`, `plan` and "
            "`submit` run without it")


def require(command: str, *modules: str) -> None:
    """Refuse `hpcmem <command>` in one line (exit 2) when a library it needs is not installed — before anything is
    written (a folder made, a file opened)."""
    for module in modules:
        if importlib.util.find_spec(module) is None:
            raise HpcmemError(missing_extra(module, command.split()))

"""TRL's defaults, as `trl <trainer> --help` shows them: each field's dataclass default in the classes that trainer's
script parses (transformers' TrainingArguments, then the trainer's TRL config over it, ModelConfig and the script's
argument classes).

Read from TRL 1.16 / transformers 5.24 into trl_defaults.json (each TRL class keeps only what it adds or re-declares
with another default; enums as their values, other objects as their text), pinned against the installed libraries by
tests/job/test_trl_defaults.py, so that the light install shows them without importing TRL. A default is the
dataclass's, before `__post_init__` (TRL's `bf16: None` means "bf16 unless fp16").
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from hpcmem.job.trainers import entry
from hpcmem.job.trainers.fields import SCRIPT_CLASSES


@lru_cache(maxsize=1)
def _table() -> dict[str, dict[str, Any]]:
    return json.loads(Path(__file__).with_name("trl_defaults.json").read_text(encoding="utf-8"))


@lru_cache(maxsize=16)
def trl_defaults(trainer: str) -> dict[str, Any]:
    """field → TRL's default for `trl <trainer>` (later classes win, as the trainer's config overrides
    TrainingArguments)."""
    e, table = entry(trainer), _table()
    out: dict[str, Any] = {}
    for cls in ("TrainingArguments", e.config_class, "ModelConfig", e.script_class, *SCRIPT_CLASSES):
        out.update(table.get(cls, {}))
    return out


def shown(value: Any) -> str:
    """A default as a user types it after the flag (JSON's spelling: true, null, [\"a\"])."""
    return value if isinstance(value, str) and value else json.dumps(value)

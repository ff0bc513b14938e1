"""The position tables of model types (position_limits.json, measured by hpcmem.lab.position_limits): which types
stop on a row past their table, what the table bounds, and how large a model's table is. hpcmem.job.position_limits
refuses jobs from it; hpcmem.job.shape takes a model's length from it when max_length is unset."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from hpcmem.models.spec import ModelSpec


@functools.lru_cache(maxsize=1)
def table() -> dict[str, Any]:
    return json.loads(Path(__file__).with_name("position_limits.json").read_text(encoding="utf-8"))


def limited_by(model_type: str) -> tuple[str, ...]:
    """What a type's table bounds: () none, ("sequence",) each sequence (indexed by position id), ("sequence", "row")
    every row as well (sliced by the row)."""
    row = table()["types"].get(model_type)
    if row is None or row.get("control") is not None or row.get("row") is None:
        return ()
    return ("sequence", "row") if isinstance(row.get("packed"), str) and not row["packed"].startswith("not probed") \
        else ("sequence",)


def model_positions(m: ModelSpec) -> tuple[str, int]:
    """(config key, value) of the model's position length: for a learned type its config's own value under the key
    its config class names it by (MPT's `max_seq_len`, which MptConfig maps to no `max_position_embeddings`), or the
    class's default for that key where the config leaves it out (what transformers builds then), else
    max_position_embeddings as hpcmem read it."""
    row = table()["types"].get(m.model_type, {})
    if m.learned is not None:
        for key in row.get("keys", []):
            value = m.learned.config.get(key, row.get("defaults", {}).get(key))
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return key, value
    return "max_position_embeddings", m.max_position_embeddings

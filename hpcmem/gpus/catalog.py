"""The GPU catalog (hpcmem/gpus.json, data): name → memory, usable capacity and speed, plus the probe calibration
(hpcmem.gpus.calibration) when records exist for the GPU."""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

from hpcmem.datapath import PACKAGE_DIR


@lru_cache(maxsize=1)
def catalog_entries() -> tuple[dict[str, Any], ...]:
    return tuple(json.loads((PACKAGE_DIR / "gpus.json").read_text(encoding="utf-8"))["gpus"])


@lru_cache(maxsize=1)
def _by_name() -> dict[str, dict]:
    return {key.lower(): e for e in catalog_entries() for key in [e["name"], *e.get("aliases", [])]}


def catalog_entry(name: str) -> dict[str, Any] | None:
    """The gpus.json entry for a catalog name or alias (any case), or None."""
    return _by_name().get(name.strip().lower())


def gpu_names() -> list[str]:
    return sorted({e["name"] for e in catalog_entries()})


def gpu_slug(gpu_name: str | None) -> str:
    """File-name form of a GPU model: "NVIDIA H200" → "nvidia-h200"; None (a CPU run) → "cpu"."""
    if not gpu_name:
        return "cpu"
    return re.sub(r"[^a-z0-9]+", "-", gpu_name.lower()).strip("-") or "unknown"


def catalog_name_for(device_name: str | None, memory_bytes: int | None) -> str | None:
    """Which catalog GPU a driver-reported name is: its model token ("H100") in the name, the variant tokens (PCIe,
    NVL) agreeing, and the memory within 8 % of the catalog's."""
    if not device_name:
        return None
    text = device_name.lower().replace(" ", "-")
    words = set(re.split(r"[^a-z0-9]+", text))
    best, best_score = None, -1
    for entry in catalog_entries():
        tokens = entry["name"].lower().split("-")
        if tokens[0] not in words:       # a whole word: "b200" is not in "nvidia-gb200", "l4" not in "nvidia-l40s"
            continue
        if memory_bytes and abs(entry["memory_bytes"] - memory_bytes) > 0.08 * entry["memory_bytes"]:
            continue
        variants = [t for t in ("pcie", "nvl", "sxm") if t in text]
        score = sum(t in tokens for t in variants) - sum(t not in text for t in tokens[1:] if not t.endswith("gb"))
        if score > best_score:
            best, best_score = entry["name"], score
    return best

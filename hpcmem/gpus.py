"""The GPU catalog (hpcmem/gpus.json, data): name → memory and speed, plus probe calibration when records exist."""

from __future__ import annotations

import json
from functools import lru_cache

from hpcmem.datapath import PACKAGE_DIR
from hpcmem.errors import HpcmemError
from hpcmem.spec import GpuSpec


@lru_cache(maxsize=1)
def _catalog() -> dict[str, dict]:
    raw = json.loads((PACKAGE_DIR / "gpus.json").read_text(encoding="utf-8"))
    table: dict[str, dict] = {}
    for entry in raw["gpus"]:
        for key in [entry["name"], *entry.get("aliases", [])]:
            table[key.lower()] = entry
    return table


def gpu_names() -> list[str]:
    return sorted({e["name"] for e in _catalog().values()})


def gpu_spec(name: str) -> GpuSpec:
    entry = _catalog().get(name.strip().lower())
    if entry is None:
        raise HpcmemError(f"unknown GPU {name!r}; known: {', '.join(gpu_names())} (hpcmem gpus)")
    calibration = _calibration(entry["name"])
    return GpuSpec(
        name=entry["name"],
        memory_bytes=entry["memory_bytes"],
        bf16_tflops=entry["bf16_tflops"],
        memory_bandwidth_gbps=entry.get("memory_bandwidth_gbps", 0.0),
        compute_capability=str(entry.get("compute_capability", "")),
        context_bytes=int(calibration["context_bytes"]) if calibration else 0,
        calibrated=calibration is not None,
        calibration_source=calibration.get("source", "") if calibration else "",
    )


def gpu_for_device(device_name: str | None, memory_bytes: int | None) -> GpuSpec | None:
    """The catalog GPU (with its calibration) of a driver-reported name and memory ("NVIDIA H200", 150109880320 B →
    H200), or None when the catalog has no match."""
    from hpcmem.validate.calibration import catalog_name_for

    name = catalog_name_for(device_name, memory_bytes)
    return gpu_spec(name) if name else None


def _calibration(name: str) -> dict | None:
    """Fitted constants from probe records (hpcmem.validate.calibration), when that module and data exist."""
    try:
        from hpcmem.validate.calibration import load_calibration
    except ImportError:
        return None
    found = load_calibration(name)
    return found if found and "context_bytes" in found else None

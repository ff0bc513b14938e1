"""A GpuSpec for a name: the catalog's entry or a site's description (hpcmem.gpus.describe), with the calibration on
the data search path (hpcmem.gpus.calibration), or the default margins when the GPU has none of its own."""

from __future__ import annotations

from typing import Any

from hpcmem.errors import HpcmemError
from hpcmem.gpus.calibration import (campaign_of, default_margins, load_calibration, multi_gpu_margin, peak_margins,
                                     single_gpu_margin)
from hpcmem.gpus.catalog import catalog_entry, catalog_name_for, gpu_names
from hpcmem.gpus.describe import parse
from hpcmem.gpus.spec import GpuSpec


def gpu_spec(name: str) -> GpuSpec:
    """A catalog GPU (name or alias, any case) or a described one (hpcmem.gpus.describe: `96GB`,
    `name=…,memory=…`), with its calibration when one is on the search path."""
    entry = catalog_entry(name)
    if entry is not None:
        return _with_calibration(
            entry["name"], memory_bytes=entry["memory_bytes"], bf16_tflops=entry["bf16_tflops"],
            memory_bandwidth_gbps=entry.get("memory_bandwidth_gbps", 0.0),
            fp16_tflops=float(entry.get("fp16_tflops", 0.0)),
            compute_capability=str(entry.get("compute_capability", "")),
            capacity_bytes=int(entry.get("capacity_bytes") or 0),
            capacity_note=entry.get("capacity_source", "") if entry.get("capacity_derived") else "",
            nvls=bool(entry.get("nvls", False)))

    described = parse(name)
    if described is None:
        raise HpcmemError(f"unknown GPU {name!r}; known: {', '.join(gpu_names())} (hpcmem gpus); or describe yours: "
                          "--gpu 96GB, or --gpu 'name=MyGPU,memory=96GB,usable=95.2GiB,cc=9.0,tflops=400'")
    if catalog_entry(described.name) is not None:
        raise HpcmemError(f"gpu name {described.name!r} is in the catalog; use it by name or describe it under "
                          "another name")
    return _with_calibration(described.name, memory_bytes=described.memory_bytes, bf16_tflops=described.bf16_tflops,
                             memory_bandwidth_gbps=described.memory_bandwidth_gbps,
                             compute_capability=described.compute_capability,
                             capacity_bytes=described.capacity_bytes, capacity_note=described.note)


def _with_calibration(name: str, **fields: Any) -> GpuSpec:
    """The GPU with its own calibration (context, margins, the campaign that measured it) or, without one, the
    default margins borrowed from the calibrated GPUs (hpcmem.gpus.calibration)."""
    calibration = load_calibration(name)
    calibrated = calibration is not None and "context_bytes" in calibration
    own = peak_margins(calibration) if calibrated else {}
    margins = own or default_margins()
    return GpuSpec(name=name, context_bytes=int(calibration["context_bytes"]) if calibrated else 0,
                   calibrated=calibrated, calibration_source=calibration.get("source", "") if calibrated else "",
                   margins=tuple(margins[p] for p in sorted(margins)),
                   campaign=campaign_of(calibration) if calibration else None,
                   multi_gpu_margin=multi_gpu_margin(), single_gpu_margin=single_gpu_margin(), **fields)


def recalibrated(spec: GpuSpec) -> GpuSpec:
    """The same GPU (catalog or described) with the calibration on the search path now, not the one it had when a
    record stored it."""
    return _with_calibration(spec.name, memory_bytes=spec.memory_bytes, bf16_tflops=spec.bf16_tflops,
                             memory_bandwidth_gbps=spec.memory_bandwidth_gbps, fp16_tflops=spec.fp16_tflops,
                             compute_capability=spec.compute_capability, capacity_bytes=spec.capacity_bytes,
                             capacity_note=spec.capacity_note, nvls=spec.nvls)


def gpu_for_device(device_name: str | None, memory_bytes: int | None) -> GpuSpec | None:
    """The catalog GPU (with its calibration) of a driver-reported name and memory ("NVIDIA H200", 150109880320 B →
    H200), or None when the catalog has no match."""
    name = catalog_name_for(device_name, memory_bytes)
    return gpu_spec(name) if name else None

"""GPUs a site owns that the catalog does not know: a bare memory size or a description (stdlib only).

Forms accepted wherever a GPU is named (`--gpu`, a preset's `gpu:`):

    96GB  ·  95.5GiB  ·  80G                        a bare size: the board's memory in GiB (what nvidia-smi's total
                                                    is close to); usable = memory − 1 GiB, derived
    name=A800-PCIe,memory=80GB,usable=79.3GiB,cc=8.0,tflops=312
                                                    a description: memory is required; usable (torch's total, the
                                                    "total capacity" of PyTorch's OOM message) defaults to memory −
                                                    1 GiB; cc (compute capability) picks the cuBLAS workspace size;
                                                    tflops (bf16 dense) feeds the planner's speed ranking
    a preset's mapping: {name, memory_gb, usable_gb, compute_capability, bf16_tflops}, the same fields

−1 GiB is the catalog's rule for capacities no measurement published (hpcmem/gpus.json: more than what the GPUs
measured lose between nvidia-smi's total and torch's; estimator/LOG.md). A described GPU is uncalibrated until a
campaign (hpcmem calibrate) writes `<name>.json` on the calibration search path; the estimate says so.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Mapping

from hpcmem.inputs.values import InputError, shown

GIB = 1024**3
DERIVED_LOSS_BYTES = GIB
MAX_MEMORY_GIB = 4096.0
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(GB|GiB|G|MiB)\s*", re.IGNORECASE)
MIB = 1024**2
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")
_CC = re.compile(r"[0-9]{1,2}\.[0-9]{1,2}|gfx[0-9a-f]{3,4}")
KEYS = {"name": "name", "memory": "memory", "memory_gb": "memory", "usable": "usable", "usable_gb": "usable",
        "cc": "compute_capability", "compute_capability": "compute_capability", "tflops": "bf16_tflops",
        "bf16_tflops": "bf16_tflops", "bandwidth": "memory_bandwidth_gbps", "memory_bandwidth_gbps":
        "memory_bandwidth_gbps"}


@dataclass(frozen=True, kw_only=True)
class Described:
    name: str
    memory_bytes: int
    capacity_bytes: int
    capacity_derived: bool
    compute_capability: str = ""
    bf16_tflops: float = 0.0
    memory_bandwidth_gbps: float = 0.0

    @property
    def text(self) -> str:
        """The one-line form (what a preset's mapping becomes, so every later reader parses one form)."""
        parts = [f"name={self.name}", f"memory={self.memory_bytes // MIB}MiB"]      # whole MiB: exact both ways
        if not self.capacity_derived:
            parts.append(f"usable={self.capacity_bytes // MIB}MiB")
        if self.compute_capability:
            parts.append(f"cc={self.compute_capability}")
        if self.bf16_tflops:
            parts.append(f"tflops={self.bf16_tflops:g}")
        if self.memory_bandwidth_gbps:
            parts.append(f"bandwidth={self.memory_bandwidth_gbps:g}")
        return ",".join(parts)

    @property
    def note(self) -> str:
        usable = (f"usable {self.capacity_bytes / GIB:.1f} GiB derived as memory − 1 GiB (give usable= from PyTorch's "
                  "OOM message 'total capacity')" if self.capacity_derived else
                  f"usable {self.capacity_bytes / GIB:.1f} GiB as described")
        return f"described GPU {self.name} ({self.memory_bytes / GIB:.1f} GiB, {usable})"


def _gib(n: int) -> str:
    return f"{n / GIB:.3f}".rstrip("0").rstrip(".")


def size_bytes(field: str, value: Any) -> int:
    """"96GB", "95.5GiB", "80G", "97871MiB" or a number (GiB) → bytes, whole MiB; GB is read as GiB, as GPU memory
    is sold."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        gib = float(value)
    else:
        m = _SIZE.fullmatch(str(value))
        if not m:
            raise InputError(f"{field} must be a size such as 96GB, 95.5GiB or 97871MiB; got {shown(value)}")
        gib = float(m.group(1)) / (1024 if m.group(2).lower() == "mib" else 1)
    if not (math.isfinite(gib) and 0 < gib <= MAX_MEMORY_GIB):
        raise InputError(f"{field} must be a size above 0 and at most {MAX_MEMORY_GIB:g} GiB; got {shown(value)}")
    return round(gib * GIB) // MIB * MIB


def is_size(text: str) -> bool:
    return _SIZE.fullmatch(text) is not None


def parse(value: Any) -> Described | None:
    """A described GPU from a bare size, a key=value text or a mapping; None when `value` is a plain name (a catalog
    name the caller looks up). InputError names the field and the rule."""
    if isinstance(value, Mapping):
        fields = dict(value)
    elif isinstance(value, str) and is_size(value):
        fields = {"memory": value}
    elif isinstance(value, str) and "=" in value:
        fields = {}
        for part in value.split(","):
            key, sep, item = part.partition("=")
            if not sep:
                raise InputError(f"gpu description {shown(value)}: {shown(part)} is not key=value")
            fields[key.strip()] = item.strip()
    else:
        return None
    return _build(fields, value)


def _build(fields: dict[str, Any], raw: Any) -> Described:
    unknown = sorted(str(k) for k in fields if k not in KEYS)
    if unknown:
        raise InputError(f"gpu description {shown(raw)}: unknown key {', '.join(unknown)}; keys: name, memory, "
                         "usable, cc, tflops, bandwidth")
    f = {KEYS[k]: v for k, v in fields.items()}
    if f.get("memory") is None:
        raise InputError(f"gpu description {shown(raw)}: memory is required (e.g. memory=96GB)")
    memory = size_bytes("gpu memory", f["memory"])
    usable = size_bytes("gpu usable", f["usable"]) if f.get("usable") is not None else None
    if usable is not None and usable > memory:
        raise InputError(f"gpu usable must be at most the memory ({memory / GIB:g} GiB); got {shown(f['usable'])}")
    if usable is None and memory <= DERIVED_LOSS_BYTES:
        raise InputError(f"gpu memory {shown(f['memory'])} leaves nothing usable after the 1 GiB the driver keeps; "
                         "give usable= (PyTorch's 'total capacity')")
    name = str(f.get("name") or f"{_gib(memory)}GB")
    if not _NAME.fullmatch(name):
        raise InputError(f"gpu name must be letters, digits and ._+- (at most 64); got {shown(name)}")
    cc = str(f.get("compute_capability") or "")
    if cc and not _CC.fullmatch(cc):
        raise InputError(f"gpu cc must be a CUDA compute capability such as 9.0 or an AMD gfx target; got {shown(cc)}")
    return Described(name=name, memory_bytes=memory,
                     capacity_bytes=usable if usable is not None else memory - DERIVED_LOSS_BYTES,
                     capacity_derived=usable is None, compute_capability=cc,
                     bf16_tflops=_rate("gpu tflops", f.get("bf16_tflops")),
                     memory_bandwidth_gbps=_rate("gpu bandwidth", f.get("memory_bandwidth_gbps")))


def _rate(field: str, value: Any) -> float:
    if value is None or value == "":
        return 0.0
    try:
        rate = float(value)
    except (TypeError, ValueError):
        raise InputError(f"{field} must be a number ≥ 0; got {shown(value)}") from None
    if not (math.isfinite(rate) and 0 <= rate <= 1e6) or isinstance(value, bool):
        raise InputError(f"{field} must be a number ≥ 0; got {shown(value)}")
    return rate

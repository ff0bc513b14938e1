"""The trace instrument: TRL's real training step on fake, full-size tensors, every storage counted.

    from hpcmem.trace import run_trace
    result = run_trace(job)            # TraceResult; result.to_json() follows the estimate JSON contract

`StorageTracker` (hpcmem.trace.tracker) is the byte counter the trace and the probe share. Importing this package
does not import torch; the names below load their modules on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "run_trace": "hpcmem.trace.run",
    "KERNELS": "hpcmem.trace.run",
    "TraceResult": "hpcmem.trace.result",
    "StorageTracker": "hpcmem.trace.tracker",
    "hf_config_dict": "hpcmem.trace.hf_config",
    "measure_cpu": "hpcmem.trace.selfcheck",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'hpcmem.trace' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)

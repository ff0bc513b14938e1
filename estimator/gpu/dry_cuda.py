"""Run a module of the GPU kit with no GPU: `python estimator/gpu/dry_cuda.py -m MODULE ARGS…` (run_matrix.sh's
KIT_DRY=1). Only the torch.cuda boundary is replaced: `torch.cuda.is_available()` is True, the device is a Hopper-like
stub, `torch.empty(..., device="cuda")` returns a meta tensor whose bytes are counted, and `torch.cuda.memory_stats()`
reports those counts (reserved = allocated rounded up to 2 MiB per tensor, one segment per tensor: a stub, not
PyTorch's caching allocator). Everything above that boundary — argument parsing, the stored streams, the allocator
model, the JSON lines written — is the real code. Its numbers are not a GPU's: a dry run checks paths, not peaks.
"""

from __future__ import annotations

import runpy
import sys
import weakref
from pathlib import Path
from types import SimpleNamespace

NAME = "dry-run stub (no GPU)"
TOTAL = 150_109_880_320                 # what torch reports for an H200 (hpcmem gpus: H200 capacity_bytes)
PAGE = 2 * 1024**2


class _Counts:
    def __init__(self) -> None:
        self.allocated = self.reserved = self.peak_allocated = self.peak_reserved = 0
        self.segments = self.peak_segments = 0

    def add(self, nbytes: int, sign: int) -> None:
        self.allocated += sign * nbytes
        self.reserved += sign * -(-nbytes // PAGE) * PAGE
        self.segments += sign
        self.peak_segments = max(self.peak_segments, self.segments)
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.peak_reserved = max(self.peak_reserved, self.reserved)

    def stats(self) -> dict[str, int]:
        return {"allocated_bytes.all.current": self.allocated, "allocated_bytes.all.peak": self.peak_allocated,
                "reserved_bytes.all.current": self.reserved, "reserved_bytes.all.peak": self.peak_reserved,
                "segment.all.current": self.segments, "segment.all.peak": self.peak_segments}

    def reset_peaks(self) -> None:
        self.peak_allocated, self.peak_reserved, self.peak_segments = self.allocated, self.reserved, self.segments


def install() -> None:
    import torch

    counts = _Counts()
    real_empty = torch.empty

    def empty(*size, device=None, **kwargs):
        if device is None or torch.device(device).type != "cuda":
            return real_empty(*size, device=device, **kwargs)
        t = real_empty(*size, device="meta", **kwargs)
        nbytes = t.numel() * t.element_size()
        counts.add(nbytes, +1)
        weakref.finalize(t, counts.add, nbytes, -1)
        return t

    props = SimpleNamespace(name=NAME, total_memory=TOTAL, major=9, minor=0, multi_processor_count=132)
    cuda = torch.cuda
    torch.empty = empty
    cuda.is_available = lambda: True
    cuda.init = lambda: None
    cuda.device_count = lambda: 1
    cuda.current_device = lambda: 0
    cuda.synchronize = lambda *a, **k: None
    cuda.get_device_name = lambda *a, **k: NAME
    cuda.get_device_properties = lambda *a, **k: props
    cuda.get_device_capability = lambda *a, **k: (9, 0)
    cuda.empty_cache = lambda: None
    cuda.reset_peak_memory_stats = lambda *a, **k: counts.reset_peaks()
    cuda.memory_stats = lambda *a, **k: counts.stats()
    cuda.memory_allocated = lambda *a, **k: counts.allocated
    cuda.memory_reserved = lambda *a, **k: counts.reserved
    cuda.max_memory_allocated = lambda *a, **k: counts.peak_allocated
    cuda.max_memory_reserved = lambda *a, **k: counts.peak_reserved


def main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[0] != "-m":
        sys.exit("usage: python estimator/gpu/dry_cuda.py -m MODULE [ARGS…]")
    sys.path.insert(0, str(Path.cwd()))          # as `python -m` would: the project root first
    install()
    sys.argv = [argv[1], *argv[2:]]
    runpy.run_module(argv[1], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])

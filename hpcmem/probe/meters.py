"""What a probe reads while the trainer runs: peaks per phase segment, on CUDA or on CPU.

A meter answers `segment()` — the peaks since the previous call — and resets them, so that `PhaseClock` can give every
phase of every step its own peak. On CUDA the numbers are PyTorch's caching allocator statistics
(`torch.cuda.memory_stats`: allocated/reserved peaks, `num_alloc_retries`, `num_ooms`) and the device's used memory
from NVML (`pynvml`, the nvidia-ml-py package), sampled by a thread because NVML has no peak; without NVML,
`torch.cuda.mem_get_info` at segment ends. On CPU they are the live tensor bytes of `ProbeTracker` (the trace
instrument's storage tracker, so a CPU probe and a trace count the same way) and the process RSS.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from hpcmem.record.job import SHARED_ENV
from hpcmem.trace.tracker import StorageTracker


class ProbeTracker(StorageTracker):
    """The shared storage tracker, plus what a real run needs.

    - meta tensors hold no memory (DeepSpeed keeps `round_robin_bit16_meta` copies on the meta device): not counted;
    - `capacity_bytes`: going past it raises `torch.OutOfMemoryError`, a CPU stand-in for a GPU that is too small;
    - storages resized in place (`UntypedStorage.resize_`, how FSDP2 frees and re-allocates unsharded parameters) are
      re-counted at once: the tracker otherwise sees a new size only when the storage next leaves an op.
    """

    def __init__(self, *, capacity_bytes: int | None = None, **kw: Any) -> None:
        super().__init__(**kw)
        self.capacity_bytes = capacity_bytes
        self._saved_resize: Any = None

    def __enter__(self) -> ProbeTracker:
        super().__enter__()
        self._watch_resizes()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._unwatch_resizes()
        super().__exit__(*exc)

    def _register(self, t: Any, category: str | None, relabel: bool = False) -> None:
        if t.device.type != "meta":
            super()._register(t, category, relabel)

    def _add(self, nbytes: int, category: str) -> None:
        super()._add(nbytes, category)
        if self.capacity_bytes is not None and self.current_bytes > self.capacity_bytes:
            import torch

            cap, need = self.capacity_bytes, self.current_bytes
            self.capacity_bytes = None          # raise once: unwinding and cleanup allocate too
            raise torch.OutOfMemoryError(f"probe capacity {cap} B exceeded: {need} B of tensors live in "
                                         f"{self.current_phase}")

    def _watch_resizes(self) -> None:
        import torch

        cls = torch.UntypedStorage
        original = cls.resize_
        tracker = self

        def resize_(storage: Any, size: int) -> Any:
            out = original(storage, size)
            if tracker._mode is not None and id(storage) in tracker._live:
                # any op that returns a tensor on this storage makes the tracker re-read its size
                torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
            return out

        self._saved_resize = original
        cls.resize_ = resize_

    def _unwatch_resizes(self) -> None:
        if self._saved_resize is not None:
            import torch

            torch.UntypedStorage.resize_ = self._saved_resize
            self._saved_resize = None


class CpuMeter:
    """Live tensor bytes (ProbeTracker) and the process's resident set on CPU."""

    device = "cpu"

    def __init__(self, capacity_bytes: int | None = None) -> None:
        self.tracker = ProbeTracker(capacity_bytes=capacity_bytes)

    def __enter__(self) -> CpuMeter:
        self.tracker.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.tracker.__exit__(*exc)

    def set_phase(self, name: str) -> None:
        self.tracker.set_detail(name)

    def segment(self) -> dict[str, int]:
        out = {"allocated_bytes": self.tracker.peak_bytes, "rss_bytes": rss_bytes()}
        self.tracker.reset_peak()
        return out

    def reset_totals(self) -> None:
        reset_rss_peak()

    def totals(self) -> dict[str, Any]:
        return {"rss_peak_bytes": rss_peak_bytes(), "live_bytes_end": self.tracker.current_bytes}

    def info(self) -> dict[str, Any]:
        return {"device": "cpu", "gpu_name": None, "memory_bytes": _host_memory_bytes(), "cpus": os.cpu_count()}


class CudaMeter:
    """Caching-allocator peaks and NVML device usage of one CUDA device."""

    device = "cuda"

    def __init__(self, index: int = 0, capacity_bytes: int | None = None, sample_s: float = 0.002) -> None:
        self.index = index
        self.capacity_bytes = capacity_bytes
        self.nvml = NvmlSampler(index, sample_s, per_process=os.environ.get(SHARED_ENV) == "1")
        self.baseline_device_bytes = self.nvml.used()   # before this process creates its CUDA context

    def __enter__(self) -> CudaMeter:
        import torch

        torch.cuda.set_device(self.index)
        total = torch.cuda.get_device_properties(self.index).total_memory
        if self.capacity_bytes is not None:
            torch.cuda.set_per_process_memory_fraction(min(1.0, self.capacity_bytes / total), self.index)
        torch.cuda.reset_peak_memory_stats(self.index)
        if self.nvml.per_process:
            torch.empty(1, device=f"cuda:{self.index}")     # the context exists: NVML lists this process from here
        self.nvml.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.nvml.stop()

    def set_phase(self, name: str) -> None:
        pass

    def segment(self) -> dict[str, int | None]:
        import torch

        torch.cuda.synchronize(self.index)
        stats = torch.cuda.memory_stats(self.index)
        reserved_now = stats.get("reserved_bytes.all.current", 0)
        out = {
            "allocated_bytes": stats.get("allocated_bytes.all.peak", 0),
            "reserved_bytes": stats.get("reserved_bytes.all.peak", 0),
            "device_bytes": self.nvml.take(),
            # device used outside the allocator now (context, libraries, NCCL) + the reserved peak: a floor for the
            # device peak when sampling missed it
            "device_derived_bytes": self.nvml.used() - reserved_now + stats.get("reserved_bytes.all.peak", 0),
        }
        torch.cuda.reset_peak_memory_stats(self.index)
        return out

    def reset_totals(self) -> None:
        pass

    def totals(self) -> dict[str, Any]:
        import torch

        stats = torch.cuda.memory_stats(self.index)
        return {"num_alloc_retries": stats.get("num_alloc_retries", 0), "num_ooms": stats.get("num_ooms", 0),
                "device_baseline_bytes": self.baseline_device_bytes, "nvml": self.nvml.source,
                "rss_peak_bytes": rss_peak_bytes()}

    def info(self) -> dict[str, Any]:
        import torch

        props = torch.cuda.get_device_properties(self.index)
        return {"device": "cuda", "gpu_name": props.name, "memory_bytes": props.total_memory,
                "capability": f"{props.major}.{props.minor}", "cuda": torch.version.cuda,
                "driver": self.nvml.driver(), "cudnn": torch.backends.cudnn.version()}


class NvmlSampler:
    """Device used bytes (or this process's, `per_process`), sampled by a daemon thread; falls back to
    `torch.cuda.mem_get_info` without NVML."""

    def __init__(self, index: int, sample_s: float, per_process: bool = False) -> None:
        self.index, self.sample_s = index, sample_s
        self.per_process = per_process
        self.pid = os.getpid()
        self.handle: Any = None
        self.source = "torch.cuda.mem_get_info"
        try:
            import pynvml

            pynvml.nvmlInit()
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(_physical_index(index))
            self.source = "nvml"
        except Exception:  # noqa: BLE001 - no NVML (library missing, container without the driver's libnvidia-ml)
            self.handle = None
        self._max = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def used(self) -> int:
        if self.handle is not None:
            import pynvml

            if self.per_process:
                return self._process_used()
            return int(pynvml.nvmlDeviceGetMemoryInfo(self.handle).used)
        import torch

        free, total = torch.cuda.mem_get_info(self.index)
        return int(total - free)

    def driver(self) -> str | None:
        if self.handle is None:
            return None
        import pynvml

        v = pynvml.nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else str(v)

    def _process_used(self) -> int:
        """This pid's used GPU memory (0 before its CUDA context exists)."""
        import pynvml

        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(self.handle):
            if p.pid == self.pid and p.usedGpuMemory is not None:
                return int(p.usedGpuMemory)
        return 0

    def start(self) -> None:
        if self.handle is None:
            return
        if self.per_process:
            if self._process_used():
                self.source = "nvml per-process"
            else:           # a PID namespace hides us from NVML: the device total is all there is
                self.per_process = False
                self.source = "nvml device total (this pid is not listed by NVML)"
        self._thread = threading.Thread(target=self._run, name="hpcmem-nvml", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)

    def take(self) -> int:
        """The largest used value since the last take (and now)."""
        now = self.used()
        peak, self._max = max(self._max, now), 0
        return peak

    def _run(self) -> None:
        while not self._stop.is_set():
            value = self.used()
            if value > self._max:
                self._max = value
            time.sleep(self.sample_s)


def _physical_index(index: int) -> int:
    """NVML numbers devices physically; CUDA_VISIBLE_DEVICES renumbers them for torch."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    ids = [v.strip() for v in visible.split(",") if v.strip()]
    if ids and index < len(ids) and ids[index].isdigit():
        return int(ids[index])
    return index


def _status_kib(key: str) -> int:
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def rss_bytes() -> int:
    return _status_kib("VmRSS")


def rss_peak_bytes() -> int:
    return _status_kib("VmHWM")


def reset_rss_peak() -> None:
    """Linux: writing 5 to clear_refs resets VmHWM to the current RSS (proc(5))."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
            fh.write("5")
    except OSError:
        pass


def trim_heap() -> None:
    """Give the C heap's free pages back to the kernel (glibc `malloc_trim(0)`), so the RSS is the memory in use;
    elsewhere nothing happens."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _host_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return None

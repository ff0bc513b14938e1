"""What a trace measured, in the estimate JSON contract (`hpcmem estimate --json` has the same top-level shape)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Always true of a trace: the single-GPU step is what it runs; these are modelled analytically or by probes.
NOT_MODELLED: tuple[str, ...] = (
    "multi-GPU sharding (ZeRO-1/2/3, FSDP): the trace runs one unsharded GPU; sharding is applied analytically",
    "caching-allocator reserve and fragmentation (peak_reserved_bytes): the allocator model was off (--allocator "
    "off, or --kernels cpu: no CUDA caching allocator); a probe measures it",
    "CUDA context, cuBLAS/cuBLASLt workspaces, NCCL buffers (device_peak_bytes): measured by probes",
    "kernel workspaces other than FlashAttention's backward (memory-efficient and cuDNN attention, cuBLAS)",
)
# In place of NOT_MODELLED[1] when the allocator model ran: what peak_reserved_bytes is and is not.
RESERVED_MODELLED = ("peak_reserved_bytes is the caching-allocator model (hpcmem/estimate/caching_allocator.py, "
                     "{mode} mode) replaying the traced allocations with cuBLAS/cuBLASLt workspaces, not a measurement")


@dataclass
class TraceResult:
    """Peak live tensor bytes of two optimizer steps of TRL's SFTTrainer, traced on fake tensors (or measured)."""

    model_name: str
    num_params: int
    peak_allocated_bytes: int
    phase: str
    components: dict[str, int]
    kernels: str
    versions: dict[str, str]
    seconds: float
    reimplemented: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    not_modelled: list[str] = field(default_factory=lambda: list(NOT_MODELLED))
    step_peaks: list[dict[str, Any]] = field(default_factory=list)
    batch: dict[str, Any] = field(default_factory=dict)
    offloaded_host_peak_bytes: int = 0
    num_ops: int = 0
    timeline: list[Any] | None = None       # TimelinePoints when run_trace(..., timeline=True); not in the JSON
    # with the timeline: bytes alive when a backward ended, by the phase they were born in; not in the JSON
    left_after_backward: dict[str, int] = field(default_factory=dict)
    # per decoder layer, its parameters that require grad and got none (name → [elements, bytes per element]:
    # hpcmem.trace.phases `Instrumented.idle_in_layers`); not in the JSON
    idle_in_layers: list[dict[str, list[int]]] = field(default_factory=list)
    allocator: dict[str, dict[str, Any]] | None = None  # mode -> simulated allocator stats (run_trace allocator=)
    reserved_mode: str | None = None    # the allocator mode whose reserved peak is the JSON's peak_reserved_bytes
    events: list[Any] | None = None     # the recorded device stream (hpcmem.trace.events); not in the JSON

    def __post_init__(self) -> None:
        total = sum(self.components.values())
        if total != self.peak_allocated_bytes:
            raise ValueError(f"components add up to {total} bytes, not the peak {self.peak_allocated_bytes}")

    @property
    def peak_reserved_bytes(self) -> int | None:
        """The allocator model's reserved peak in the job's mode (cuBLAS workspaces included); None when it was off."""
        stats = (self.allocator or {}).get(self.reserved_mode or "")
        return int(stats["peak_reserved_bytes"]) if stats else None

    def to_json(self) -> dict[str, Any]:
        out = self._json()
        if self.allocator is not None:     # only when the allocator model ran (hpcmem.estimate.caching_allocator)
            out["trace"]["allocator"] = {mode: dict(stats) for mode, stats in self.allocator.items()}
        return out

    def _json(self) -> dict[str, Any]:
        return {
            "model": {"name": self.model_name, "num_params": self.num_params},
            "per_gpu": {
                "peak_allocated_bytes": self.peak_allocated_bytes,
                "peak_reserved_bytes": self.peak_reserved_bytes,
                "device_peak_bytes": None,
                "phase": self.phase,
                "components": dict(sorted(self.components.items())),
            },
            "gpu": None,
            "fits": None,
            "warnings": list(self.warnings),
            "not_modelled": list(self.not_modelled),
            "trace": {
                "kernels": self.kernels,
                "versions": dict(self.versions),
                "reimplemented": list(self.reimplemented),
                "seconds": round(self.seconds, 3),
                "steps": list(self.step_peaks),
                "batch": dict(self.batch),
                "offloaded_host_peak_bytes": self.offloaded_host_peak_bytes,
                "num_ops": self.num_ops,
            },
        }

    def to_text(self) -> str:
        """A short table for the terminal."""
        gib = 1024 ** 3
        lines = [f"model {self.model_name} ({self.num_params / 1e9:.2f} B params) · trace, kernels {self.kernels} · "
                 f"{self.batch.get('layout', '?')} batch {self.batch.get('shape')}",
                 f"{'component':<22}{'bytes':>18}{'GiB':>10}"]
        for name, nbytes in sorted(self.components.items(), key=lambda kv: -kv[1]):
            lines.append(f"{name:<22}{nbytes:>18,}{nbytes / gib:>10.2f}")
        lines.append(f"{'peak allocated':<22}{self.peak_allocated_bytes:>18,}{self.peak_allocated_bytes / gib:>10.2f}"
                     f"  ({self.phase})")
        if self.peak_reserved_bytes is not None:
            lines.append(f"{'peak reserved':<22}{self.peak_reserved_bytes:>18,}{self.peak_reserved_bytes / gib:>10.2f}"
                         f"  (allocator model, {self.reserved_mode})")
        for s in self.step_peaks:
            lines.append(f"  step {s['step']} peak {s['peak_allocated_bytes'] / gib:.2f} GiB at {s['phase']}")
        if self.offloaded_host_peak_bytes:
            lines.append(f"offloaded to host (peak) {self.offloaded_host_peak_bytes / gib:.2f} GiB")
        lines.append(f"traced in {self.seconds:.1f} s ({self.num_ops:,} ops)")
        lines += [f"warning: {w}" for w in self.warnings]
        lines.append("not modelled: " + "; ".join(self.not_modelled))
        return "\n".join(lines)


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("torch", "transformers", "trl", "peft"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "absent"
    return out

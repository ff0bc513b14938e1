"""GpuSpec: one GPU model from the catalog or a site's description, with the calibration (margins per peak, the
campaign that measured it) when probe records exist."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class PeakMargin:
    """How much one peak's estimate is widened for the safe bound: (predicted + half its reserved spread) ·
    (1 + margin) covered `coverage` of `n` probe runs on `calibrated_on` (hpcmem.gpus.calibration). `default` marks a
    margin borrowed from other GPUs' records because this GPU has none of its own."""

    peak: str                       # allocated | reserved | device
    margin: float
    coverage: float
    n: int
    calibrated_on: str
    default: bool = False
    evidence: str = ""              # "" for probe runs; else what the margin was fitted on (published multi-GPU rows)
    held_out_covered: int = 0       # of held_out_n rows not used to fit it, how many the bound covered
    held_out_n: int = 0
    since_fit_covered: int = 0      # of since_fit_n runs made after the fit (never in it), how many the bound covered
    since_fit_n: int = 0


@dataclass(frozen=True, kw_only=True)
class Campaign:
    """The calibration campaign that measured a GPU (`hpcmem calibrate`): where, when, how many runs."""

    name: str
    site: str
    date: str                       # YYYY-MM-DD of the fit
    n: int                          # probe records the calibration was fitted on
    device: str = "cuda"            # cuda, or cpu for a rehearsal that measured no GPU


@dataclass(frozen=True, kw_only=True)
class GpuSpec:
    """One GPU model from the catalog (hpcmem/gpus.json) or described by a site (hpcmem.gpus.describe), with its
    calibration when probes exist."""

    name: str
    memory_bytes: int               # the total nvidia-smi / NVML reports
    bf16_tflops: float
    memory_bandwidth_gbps: float = 0.0
    compute_capability: str = ""  # "9.0" (CUDA major.minor) picks the cuBLAS workspace size
    fp16_tflops: float = 0.0        # 0: the bf16 rate (Ampere and later run both on the same Tensor Cores)
    context_bytes: int = 0          # CUDA context + libraries; 0 → the uncalibrated default in estimate.device
    calibrated: bool = False
    calibration_source: str = ""
    capacity_bytes: int = 0         # what torch can use (mem_get_info's total); 0 → memory_bytes
    margins: tuple[PeakMargin, ...] = ()
    capacity_note: str = ""         # how the usable capacity is known when no measurement gave it (derived, described)
    nvls: bool = False              # on an NVSwitch board that does NVLink SHARP: NCCL's NVLS buffers (estimate.nccl)
    campaign: Campaign | None = None
    multi_gpu_margin: PeakMargin | None = None  # the device margin of multi-GPU jobs (hpcmem.gpus.calibration)
    single_gpu_margin: PeakMargin | None = None  # published single-GPU rows' margin (uncalibrated GPUs, one GPU)

    @property
    def usable_bytes(self) -> int:
        return self.capacity_bytes or self.memory_bytes

    def peak_tflops(self, fp16: bool) -> float:
        """The dense rate a job of this precision gets: fp16's where the catalog gives one apart (the V100: fp16
        Tensor Cores, no bf16 ones), else the bf16 rate."""
        return self.fp16_tflops if fp16 and self.fp16_tflops else self.bf16_tflops

    def margin(self, peak: str) -> PeakMargin | None:
        return next((m for m in self.margins if m.peak == peak), None)

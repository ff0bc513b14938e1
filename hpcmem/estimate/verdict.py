"""The fit verdict users act on: does the job fit the GPU, and with what confidence (pure, stdlib only).

    safe bound = (device peak + s / 2) · (1 + m)
                 m: the GPU's safe-bound margin for the device peak
                 s: the reserved spread, a block the caching allocator may or may not map again
                    (hpcmem.estimate.allocator.placement_spread); the point estimate sits between the two outcomes,
                    the bound starts from the upper one, and m is fitted on measured / (device peak + s / 2)
                 + v: what varying batch shapes need above the worst batch (hpcmem.estimate.shapes), added
                    whole inside the parentheses; not in m's fit (the probes repeat one batch shape)
    capacity   = what torch can use on the GPU  torch.cuda.mem_get_info()'s total (gpus.json capacity_bytes),
                                                not the marketing size nor nvidia-smi's total

Three levels:
    fits           safe bound ≤ capacity
    tight          device peak ≤ capacity < safe bound: the point estimate fits, its error may not
    does not fit   device peak > capacity

The margin comes from the GPU's calibration (hpcmem.gpus.calibration: `margins.device` of its file, fitted on probe
records by `hpcmem validate probes --fit`), with the coverage its n allows: the share of runs like the
probed ones whose device peak the bound covers (≥ k/(n+1), split conformal; see hpcmem.validate.calibration). A GPU
without a calibration gets the largest device margin of the calibrated GPUs, labelled `default`: that coverage was
measured there, not on this GPU. Without any calibration on the search path the margin is 0 and says so. A GPU
calibrated by a site's campaign (hpcmem calibrate) is named with it: "calibrated at <site> on <date>, n = …"; a
campaign rehearsed on CPU measured no device peak, so its GPU keeps the default margin and the verdict says both.

A multi-GPU job (world size > 1) takes the margin fitted on published multi-GPU rows instead when one is on the search
path (hpcmem.gpus.calibration `multi_gpu_margin`, hpcmem.validate.published_margin); a one-GPU job on a GPU without
its own calibration takes the one fitted on published single-GPU rows (`single_gpu_margin`), else the multi-GPU one.
Both are labelled `published` with their held-out coverage: the rows of each source covered by the margin fitted
without that source (none when the rows come from one source: then the verdict says in-sample). A single-GPU margin
is lent to a multi-GPU job only when no multi-GPU file exists, and the verdict then says so.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from typing import Any

from hpcmem.estimate.names import Level, Name
from hpcmem.gpus.spec import Campaign, GpuSpec, PeakMargin

GIB = 1024**3
FITS, TIGHT, DOES_NOT_FIT = Level.FITS, Level.TIGHT, Level.DOES_NOT_FIT
PEAK = "device"         # the peak the verdict compares: everything the process holds on the GPU


class MarginSource(Name):
    """Where the device margin comes from: this GPU's records, the calibrated GPUs' (default), or nowhere."""

    CALIBRATED = "calibrated"
    DEFAULT = "default"
    PUBLISHED = "published"         # fitted on published multi-GPU rows
    NONE = "none"


@dataclass(frozen=True, kw_only=True)
class Calibration:
    """What stands behind a verdict's margin."""

    status: MarginSource
    gpu: str | None                    # the GPU whose records the margin was fitted on
    n: int                             # probe runs of that fit
    coverage: float | None             # the share of those runs the bound covered
    note: str
    campaign: Campaign | None = None
    held_out_covered: int = 0          # rows / runs not used to fit the margin that its bound covered …
    held_out_n: int = 0                # … of these
    since_fit_covered: int = 0         # runs made after the fit (hpcmem validate probes --score-since-fit) covered …
    since_fit_n: int = 0               # … of these
    world_size: int = 1
    evidence: str = ""                 # what a published margin was fitted on ("published single-GPU rows")

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, "gpu": self.gpu, "n": self.n, "coverage": self.coverage, "note": self.note,
                "evidence": self.evidence,
                "held_out": {"covered": self.held_out_covered, "n": self.held_out_n},
                "since_fit": {"covered": self.since_fit_covered, "n": self.since_fit_n},
                "world_size": self.world_size,
                "campaign": None if self.campaign is None else asdict(self.campaign)}

    @property
    def held_out(self) -> str:
        return f"{self.held_out_covered}/{self.held_out_n}" if self.held_out_n else "none"

    @property
    def since_fit(self) -> str:
        """"; runs since the fit: 23/26 covered", or "" when none was scored."""
        return f"; runs since the fit: {self.since_fit_covered}/{self.since_fit_n} covered" if self.since_fit_n else ""


@dataclass(frozen=True, kw_only=True)
class FitVerdict:
    level: Level
    gpu_name: str
    device_peak_bytes: int
    spread_bytes: int                  # the reserved spread; its upper half is in the safe bound
    safe_device_peak_bytes: int
    capacity_bytes: int
    margin: float
    coverage: float | None             # None unless this GPU's own records stand behind the margin
    calibration: Calibration
    shapes_bytes: int = 0              # varying batch shapes (hpcmem.estimate.shapes), whole in the safe bound

    @property
    def fits(self) -> bool:
        return self.level == FITS

    @property
    def headroom_bytes(self) -> int:
        """Capacity left above the safe bound (negative when it does not fit)."""
        return self.capacity_bytes - self.safe_device_peak_bytes

    def to_json(self) -> dict[str, Any]:
        return {"level": self.level, "fits": self.fits, "safe_device_peak_bytes": self.safe_device_peak_bytes,
                "device_peak_bytes": self.device_peak_bytes, "spread_bytes": self.spread_bytes,
                "shapes_bytes": self.shapes_bytes, "capacity_bytes": self.capacity_bytes,
                "margin": self.margin, "coverage": self.coverage, "calibration": self.calibration.to_json()}

    def line(self) -> str:
        """One line: "fits with 94.7 % coverage: safe bound 71.2 of 79.1 GiB (…), calibrated on H200, n = 18"."""
        cal = self.calibration
        if self.level == DOES_NOT_FIT:
            return (f"does not fit: device peak {self.device_peak_bytes / GIB:.1f} GiB > "
                    f"{self.capacity_bytes / GIB:.1f} GiB usable on {self.gpu_name}"
                    + ("" if cal.status == MarginSource.CALIBRATED else f" ({self.gpu_name} uncalibrated)"))
        head = "fits" if self.level == FITS else "tight: the point estimate fits, the safe bound does not"
        upper = (f"device peak {self.device_peak_bytes / GIB:.1f} + half spread {self.spread_bytes / 2 / GIB:.2f}"
                 if self.spread_bytes else f"device peak {self.device_peak_bytes / GIB:.1f}")
        upper += f" + shapes {self.shapes_bytes / GIB:.2f}" if self.shapes_bytes else ""
        upper += ", then" if self.spread_bytes or self.shapes_bytes else ""
        bound = (f"safe bound {self.safe_device_peak_bytes / GIB:.1f} of {self.capacity_bytes / GIB:.1f} GiB "
                 f"({upper} + {100 * self.margin:.1f} %)")
        campaign = cal.campaign
        if cal.status == MarginSource.CALIBRATED and campaign:
            return (f"{head} with {pct(100 * self.coverage)} % coverage: {bound}, calibrated at {campaign.site} on "
                    f"{campaign.date}, n = {cal.n} (campaign {campaign.name})")
        if cal.status == MarginSource.PUBLISHED:
            why = (f"{cal.world_size} GPUs" if cal.world_size > 1 else f"{self.gpu_name} uncalibrated")
            held = (f"held-out coverage {cal.held_out} (leave one source out)" if cal.held_out_n else
                    "in-sample: one source, nothing held out")
            return (f"{head} ({why}) — {bound}, margin {100 * self.margin:.1f} % from {cal.evidence or 'published rows'} "
                    f"(n = {cal.n}), {held}")
        lent = f"; single-GPU margin lent to {cal.world_size} GPUs" if cal.world_size > 1 else ""
        if cal.status == MarginSource.CALIBRATED:
            return (f"{head} with {pct(100 * self.coverage)} % coverage: {bound}, calibrated on {cal.gpu}, "
                    f"n = {cal.n} (in-sample; held out: {cal.held_out} covered{cal.since_fit}){lent}")
        if cal.status == MarginSource.DEFAULT:
            rehearsed = (f"; campaign {campaign.name} at {campaign.site} on {campaign.date} ran on "
                         f"{campaign.device}" if campaign else "")
            return (f"{head} ({self.gpu_name} uncalibrated{rehearsed}, coverage unknown) — {bound}, default margin "
                    f"from {cal.gpu}'s records (n = {cal.n}, {pct(100 * cal.coverage)} % coverage there){lent}")
        return f"{head} (no calibration anywhere: margin 0) — {bound}"


def pct(value: float | None) -> str:
    """94.74 → "94.7", 95.0 → "95" (one decimal, never rounded up past what was measured)."""
    if value is None:
        return "-"
    text = f"{math.floor(value * 10 + 1e-9) / 10:.1f}"
    return text[:-2] if text.endswith(".0") else text


def upper(predicted: float, spread_bytes: float) -> float:
    """The upper outcome of a peak estimated between two: the point estimate + half its spread."""
    return predicted + spread_bytes / 2


def device_margin(gpu: GpuSpec, world_size: int = 1) -> PeakMargin | None:
    """The device margin a job on `world_size` GPUs of `gpu` gets (module docstring): the published multi-GPU one for
    several GPUs, the published single-GPU one for one uncalibrated GPU, when there are such; else the GPU's own (or
    the default)."""
    own = gpu.margin(PEAK)
    if world_size > 1 and gpu.multi_gpu_margin is not None:
        return gpu.multi_gpu_margin
    if own is None or own.default:      # uncalibrated: published evidence of its own kind of job, when there is some
        published = gpu.single_gpu_margin if world_size == 1 else None
        return published or gpu.multi_gpu_margin or own
    return own


def safe_bound(device_peak_bytes: int, gpu: GpuSpec, spread_bytes: int = 0, world_size: int = 1,
               shapes_bytes: int = 0) -> int:
    m = device_margin(gpu, world_size)
    return math.ceil((upper(device_peak_bytes, spread_bytes) + shapes_bytes) * (1.0 + (m.margin if m else 0.0)))


def judge(device_peak_bytes: int, gpu: GpuSpec, spread_bytes: int = 0, world_size: int = 1,
          shapes_bytes: int = 0) -> FitVerdict:
    """The verdict for a device peak (± half `spread_bytes`, + `shapes_bytes` when batch shapes vary) of a job on
    `world_size` GPUs of `gpu` (its capacity and margins as hpcmem.gpus.lookup.gpu_spec built them)."""
    m = device_margin(gpu, world_size)
    capacity = gpu.usable_bytes
    safe = safe_bound(device_peak_bytes, gpu, spread_bytes, world_size, shapes_bytes)
    level = FITS if safe <= capacity else TIGHT if device_peak_bytes <= capacity else DOES_NOT_FIT
    calibration = _job_calibration(gpu, world_size)
    coverage = None
    if m is not None and m.evidence:
        coverage = m.held_out_covered / m.held_out_n if m.held_out_n else None     # the held-out share, not in-sample
    elif m is not None and not m.default:
        coverage = m.coverage
    return FitVerdict(level=level, gpu_name=gpu.name, device_peak_bytes=device_peak_bytes, spread_bytes=spread_bytes,
                      safe_device_peak_bytes=safe, capacity_bytes=capacity, margin=m.margin if m else 0.0,
                      coverage=coverage, calibration=calibration, shapes_bytes=shapes_bytes)


@lru_cache(maxsize=64)      # pure in (gpu, world_size): the planner judges thousands of combinations on one GPU
def _job_calibration(gpu: GpuSpec, world_size: int) -> Calibration:
    """`_calibration` of the margin a job on `world_size` GPUs of `gpu` gets, with the GPU's capacity note."""
    calibration = replace(_calibration(gpu, device_margin(gpu, world_size)), world_size=world_size)
    if gpu.capacity_note:
        calibration = replace(calibration, note=f"{calibration.note}; capacity: {gpu.capacity_note}")
    return calibration


def _calibration(gpu: GpuSpec, m: PeakMargin | None) -> Calibration:
    """Where the device margin comes from: published multi-GPU rows, this GPU's records, the calibrated GPUs'
    (default), or nowhere."""
    if m is not None and m.evidence:
        return Calibration(status=MarginSource.PUBLISHED, gpu=None, n=m.n, coverage=m.coverage, campaign=gpu.campaign,
                           held_out_covered=m.held_out_covered, held_out_n=m.held_out_n, evidence=m.evidence,
                           note=f"margin fitted on {m.n} {m.calibrated_on}; in-sample coverage "
                                f"{pct(100 * m.coverage)} %, held out one source at a time: {m.held_out_covered}/"
                                f"{m.held_out_n} rows covered")
    if m is None:
        return Calibration(status=MarginSource.NONE, gpu=None, n=0, coverage=None, campaign=gpu.campaign,
                           note="no calibration on the search path (hpcmem.gpus.calibration): margin 0")
    if m.default:
        why = f"{gpu.name} has no probe records"
        if gpu.campaign is not None:
            c = gpu.campaign
            why = (f"campaign {c.name} at {c.site} on {c.date} (n = {c.n}) ran on {c.device} and measured no device "
                   f"peak of {gpu.name}")
        return Calibration(status=MarginSource.DEFAULT, gpu=m.calibrated_on, n=m.n, coverage=m.coverage,
                           campaign=gpu.campaign,
                           note=f"{why}: the largest device margin of the calibrated GPUs ({m.calibrated_on}); its "
                                f"coverage was measured there, not on {gpu.name}")
    where = f"campaign {gpu.campaign.name} at {gpu.campaign.site}" if gpu.campaign else m.calibrated_on
    since = (f"; runs made after the fit, scored against it: {m.since_fit_covered}/{m.since_fit_n} covered"
             if m.since_fit_n else "")
    return Calibration(status=MarginSource.CALIBRATED, gpu=m.calibrated_on, n=m.n, coverage=m.coverage,
                       campaign=gpu.campaign, held_out_covered=m.held_out_covered, held_out_n=m.held_out_n,
                       since_fit_covered=m.since_fit_covered, since_fit_n=m.since_fit_n,
                       note=f"margin fitted on {m.n} probe runs on {m.calibrated_on} ({where}); its coverage is "
                            f"in-sample, held-out runs covered: {m.held_out_covered}/{m.held_out_n}{since}")

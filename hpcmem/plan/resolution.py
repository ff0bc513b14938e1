"""The image resolution as a last resort: the largest `max_pixels` at which a vision-language job fits, all else kept.

Lowering the processor's max_pixels shrinks every larger image (transformers' `smart_resize`, hpcmem.job.images) and so
the vision tower's patches and the language model's image tokens — it changes what the model sees, so it is offered
after every memory technique, never chosen silently. The candidates are the multiples of the resize factor's square
(patch_size · merge_size, squared: one image token each) between the job's min_pixels and the pixels its images have
now; the estimate grows with them, so a bisection finds the largest whose safe bound fits (about log2 of the image
tokens estimates).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable

from hpcmem.estimate.verdict import judge
from hpcmem.job.images import image_geometry, pixel_bounds

if TYPE_CHECKING:
    from hpcmem.job.jobspec import JobSpec


@dataclass(frozen=True)
class ResolutionFix:
    max_pixels: int
    image_tokens: int              # per image, at max_pixels
    device_peak_bytes: int
    safe_device_peak_bytes: int


def _with_max_pixels(job: JobSpec, max_pixels: int) -> JobSpec:
    return replace(job, train=replace(job.train, max_pixels=max_pixels))


def largest_fitting_max_pixels(job: JobSpec, estimate: Callable) -> ResolutionFix | None:
    """None when the job has no images of its own size (a length profile counted its images at its own bounds), when
    its images already take the fewest tokens the bounds allow, or when even that does not fit."""
    t, vision = job.train, job.model.vision
    if vision is None or vision.image_size or t.images_per_example == 0 or job.gpu is None:
        return None         # no images of the job's own size, or a processor that resizes to one fixed size
    unit = (vision.patch_size * vision.spatial_merge_size) ** 2
    lo_pixels, _ = pixel_bounds(t, vision)
    now = image_geometry(t, vision).tokens
    lo_k = max(1, -(-lo_pixels // unit))

    def judged(k: int) -> tuple[bool, ResolutionFix]:
        candidate = _with_max_pixels(job, k * unit)
        est = estimate(candidate)
        verdict = judge(est.device_peak_bytes, job.gpu, getattr(est, "reserved_spread_bytes", 0),
                        job.parallel.world_size, getattr(est, "shapes_needed_bytes", 0))
        return verdict.fits, ResolutionFix(k * unit, image_geometry(candidate.train, vision).tokens,
                                           est.device_peak_bytes, verdict.safe_device_peak_bytes)

    if now - 1 < lo_k:
        return None
    fits, best = judged(lo_k)
    if not fits:
        return None
    lo, hi = lo_k, now - 1          # lo fits; find the largest k ≤ hi that fits
    while lo < hi:
        mid = (lo + hi + 1) // 2
        ok, fix = judged(mid)
        if ok:
            lo, best = mid, fix
        else:
            hi = mid - 1
    return best

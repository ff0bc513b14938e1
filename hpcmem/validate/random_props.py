"""Properties the estimate of any job must have, whatever the truth: the oracle that needs no trace.

For a random job hpcmem estimates: every component of every phase ≥ 0; the reserved peak ≥ the allocated peak; and
monotone non-decreasing peaks (allocated and reserved) when, all else fixed, the sequence doubles (max_length, or a
generating trainer's max_completion_length), the batch grows by one row, or the LoRA rank doubles. A variant hpcmem
refuses (a length past the model's positions) is skipped, not failed.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.validate.random_jobs import GENERATES, RandomJob
from hpcmem.validate.random_model import job_spec


def _estimate(job: RandomJob) -> Any:
    return estimate(job_spec(job))


def variants(job: RandomJob) -> list[tuple[str, RandomJob]]:
    """(what grew, the job with it grown) for each monotone property that applies to the job."""
    s = job.settings
    grown = []
    length = "max_completion_length" if job.trainer in GENERATES else "max_length"
    if s.get(length):
        grown.append((f"{length} ×2", {length: 2 * s[length]}))
    grown.append(("batch +1", {"per_device_train_batch_size": s.get("per_device_train_batch_size", 8) + 1}))
    if s.get("use_peft"):
        grown.append(("lora_r ×2", {"lora_r": 2 * s.get("lora_r", 16), "lora_alpha": 4 * s.get("lora_r", 16)}))
    return [(what, dataclasses.replace(job, settings={**s, **change})) for what, change in grown]


def properties_record(job_dict: dict[str, Any]) -> dict[str, Any]:
    """The properties that fail for one job (`failures`, one line each), how many were checked, or why none was."""
    job = RandomJob.from_dict(job_dict)
    rec: dict[str, Any] = {"id": job.id, "job": job_dict}
    try:
        base = _estimate(job)
    except SpecError as exc:
        return {**rec, "verdict": "refused", "why": " ".join(str(exc).split())[:300]}
    except Exception as exc:  # noqa: BLE001 — a crash is a finding
        return {**rec, "verdict": "estimate crashed", "why": f"{type(exc).__name__}: {exc}"[:300]}
    failures, checked = [], 2
    negative = [f"{p.name}/{c.name} {c.bytes}" for p in base.phases for c in p.components if c.bytes < 0]
    if negative:
        failures.append(f"negative components: {', '.join(negative)[:200]}")
    if base.peak_reserved_bytes < base.peak_allocated_bytes:
        failures.append(f"reserved {base.peak_reserved_bytes} < allocated {base.peak_allocated_bytes}")
    for what, grown in variants(job):
        try:
            est = _estimate(grown)
        except SpecError:
            continue
        checked += 1
        for peak in ("peak_allocated_bytes", "peak_reserved_bytes"):
            if getattr(est, peak) < getattr(base, peak):
                failures.append(f"{what}: {peak} falls {getattr(base, peak)} → {getattr(est, peak)} "
                                f"({100 * (getattr(est, peak) / getattr(base, peak) - 1):+.2f} %)")
    return {**rec, "checked": checked, "failures": failures, "verdict": "fails" if failures else "holds"}

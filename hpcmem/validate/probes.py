"""`hpcmem validate --against probes`: probe records (estimator/probes/*.jsonl) → error points per cell and peak.

By default every record is re-estimated with the estimator as it is now (the question is how good the estimator IS);
`stored=True` uses the estimate written into the record before its run (how good it WAS). A record whose spec no
longer builds falls back to its stored estimate and says so. Stdlib, plus the estimator (itself stdlib).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcmem.gpus import gpu_for_device, gpu_slug
from hpcmem.probe.record import check_record, job_from_dict, read_records
from hpcmem.validate.cells import cell_of
from hpcmem.validate.table import PEAKS, Point

# (estimate per_gpu key, measured key) per peak
KEYS = {"allocated": ("peak_allocated_bytes", "peak_allocated_bytes"),
        "reserved": ("peak_reserved_bytes", "peak_reserved_bytes"),
        "device": ("device_peak_bytes", "device_peak_bytes")}


@dataclass
class Loaded:
    records: list[dict[str, Any]]
    points: list[Point]
    notes: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)


def record_files(paths: list[str | Path]) -> list[Path]:
    out: list[Path] = []
    for p in map(Path, paths):
        out.extend(sorted(p.glob("*.jsonl")) if p.is_dir() else [p])
    return out


def load(paths: list[str | Path], *, stored: bool = False, gpu: str | None = None) -> Loaded:
    files = record_files(paths)
    loaded = Loaded(records=[], points=[], files=[str(f) for f in files])
    for f in files:
        slug = f.stem
        if gpu and slug != gpu_slug(gpu):
            continue
        for number, rec in enumerate(read_records(f), 1):
            check_record(rec, f"{f} record {number}")
            if rec.get("source", "probe") != "probe" or rec.get("status") not in ("ok", "oom"):
                continue
            if rec.get("excluded"):        # kept for the record, left out of the accuracy, and said so
                loaded.notes.append(f"record {str(rec.get('id', '?'))[:8]} ({rec.get('case') or '-'}) excluded: "
                                    f"{rec['excluded']}")
                continue
            rec["_slug"] = slug            # in memory only: the file the record came from names its GPU
            loaded.records.append(rec)
            estimate, note = estimate_for(rec, stored)
            if note:
                loaded.notes.append(note)
            if estimate is not None:
                loaded.points.extend(points_of(rec, estimate, slug))
    return loaded


def estimate_for(rec: dict[str, Any], stored: bool) -> tuple[dict[str, Any] | None, str | None]:
    saved = rec.get("estimate")
    if stored:
        return saved, None if saved else f"record {str(rec.get('id', '?'))[:8]}: no stored estimate"
    try:
        from hpcmem.estimate import estimate

        return estimate(record_job(rec)).to_json(), None
    except Exception as exc:  # noqa: BLE001 - an old record whose spec no longer builds keeps its stored estimate
        why = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
        if saved:
            return saved, f"record {str(rec.get('id', '?'))[:8]}: re-estimate failed ({why}); used the stored estimate"
        return None, f"record {str(rec.get('id', '?'))[:8]}: no estimate ({why})"


def record_job(rec: dict[str, Any]) -> Any:
    """The job as it ran: the record's spec, its allocator environment, and — when the spec named no GPU — the catalog
    GPU the probe ran on, so that the GPU's calibration and its cuBLAS workspace size apply."""
    import dataclasses

    job = job_from_dict(rec["job"], rec.get("env"))
    info = rec.get("gpu") or {}
    gpu = gpu_for_device(info.get("gpu_name"), info.get("memory_bytes")) if job.gpu is None else None
    return dataclasses.replace(job, gpu=gpu) if gpu else job


def points_of(rec: dict[str, Any], estimate: dict[str, Any], slug: str) -> list[Point]:
    per_gpu = estimate.get("per_gpu") or {}
    measured = rec.get("measured") or {}
    trainer, technique = cell_of(rec["job"])
    oom = rec.get("status") == "oom"
    capacity = ((measured.get("oom") or {}).get("need_at_least_bytes")
                or (rec.get("run") or {}).get("capacity_bytes"))
    out = []
    for peak in PEAKS:
        est_key, meas_key = KEYS[peak]
        predicted = per_gpu.get(est_key)
        value = capacity if oom else measured.get(meas_key)
        if oom and peak != _oom_peak(rec):
            continue
        if predicted is None or not value:
            continue
        out.append(Point(gpu=slug, trainer=trainer, technique=technique, peak=peak, predicted=float(predicted),
                         measured=float(value), censored=oom, record_id=str(rec.get("id", ""))))
    return out


def _oom_peak(rec: dict[str, Any]) -> str:
    """What an OOM bounds: on CPU the tracked tensor bytes; on a GPU under --capacity-bytes the allocator's reserve
    (set_per_process_memory_fraction caps it); on a GPU at its own size the device (everything had to fit)."""
    if rec.get("device") == "cpu":
        return "allocated"
    return "reserved" if (rec.get("run") or {}).get("capacity_bytes") else "device"

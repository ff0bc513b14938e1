"""`hpcmem validate probes`: probe records (estimator/probes/*.jsonl) → error points per cell and peak.

By default every record is re-estimated with the estimator as it is now (the question is how good the estimator IS);
`stored=True` uses the estimate written into the record before its run (how good it WAS). A record whose spec no
longer builds falls back to its stored estimate and says so. Stdlib, plus the estimator (itself stdlib).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcmem.estimate import estimate
from hpcmem.gpus.catalog import catalog_entry, gpu_slug
from hpcmem.gpus.lookup import gpu_for_device, recalibrated
from hpcmem.inputs.values import InputError, text
from hpcmem.record import PEAK_KEYS, Record, read_records
from hpcmem.validate.table import PEAKS, Point


@dataclass
class Loaded:
    records: list[Record]
    points: list[Point]
    notes: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    by_gpu: dict[str, list[Record]] = field(default_factory=dict)      # the GPU a file names → its records


def record_files(paths: list[str | Path]) -> list[Path]:
    out: list[Path] = []
    for p in map(Path, paths):
        out.extend(sorted(p.glob("*.jsonl")) if p.is_dir() else [p])
    return out


def filter_problems(paths: list[str | Path], gpu: str | None) -> list[str]:
    """What is wrong with a records selection before anything is read: a folder without a records file, and a --gpu
    that names nothing — neither "cpu", a catalog GPU (or alias), nor the GPU slug a records file is named by. A
    catalog GPU without records is no error (the report says so)."""
    out = [f"--records {str(p)!r}: a folder without a .jsonl records file" for p in map(Path, paths)
           if p.is_dir() and not any(p.glob("*.jsonl"))]
    if gpu is None:
        return out
    try:
        text("--gpu", gpu)
    except InputError as exc:
        return out + list(exc.problems)
    stems = sorted({f.stem for f in record_files(paths)})
    if not gpu.strip():
        out.append(f"--gpu {gpu!r}: give a GPU name (a catalog name such as H200, or cpu)")
    elif gpu_slug(gpu) != "cpu" and catalog_entry(gpu) is None and gpu_slug(gpu) not in stems:
        out.append(f"--gpu {gpu!r}: neither a catalog GPU (hpcmem gpus lists them) nor the GPU of a records file "
                   f"({', '.join(stems) or 'none'})")
    return out


def load(paths: list[str | Path], *, stored: bool = False, gpu: str | None = None,
         estimate: bool = True) -> Loaded:
    """Records of every file, each re-estimated unless `stored`; `estimate=False` reads the records only. A record is
    labelled by the GPU it says it ran on (its device name's slug: nvidia-h200), the file's name only where it names
    none: a file renamed or records copied between files do not move a run to another GPU (a note says where a
    record's GPU and its file's name disagree)."""
    files = record_files(paths)
    loaded = Loaded(records=[], points=[], files=[str(f) for f in files])
    for f in files:
        records = read_records(f)
        for rec in records:
            slug = gpu_slug(rec.gpu_name) if rec.gpu_name else f.stem
            if gpu and not same_gpu(gpu, slug, [rec]):
                continue
            if not rec.finished:
                continue
            if slug != f.stem:
                loaded.notes.append(f"record {rec.id[:8]} ({rec.case or '-'}) ran on {rec.gpu_name} but is stored in "
                                    f"{f.name}: scored as {slug}")
            if rec.excluded:               # kept for the record, left out of the accuracy, and said so
                loaded.notes.append(f"record {rec.id[:8]} ({rec.case or '-'}) excluded: {rec.excluded}")
                continue
            loaded.by_gpu.setdefault(slug, []).append(rec)
            loaded.records.append(rec)
            if not estimate:
                continue
            if rec.repeat_of:              # its memory is the earlier record's: counted once; its speed counts
                loaded.notes.append(f"record {rec.id[:8]} ({rec.case or '-'}) repeats record {rec.repeat_of[:8]}'s "
                                    "peaks byte for byte: scored once (its step times are)")
                continue
            if rec.shared_gpu:
                loaded.notes.append(f"record {rec.id[:8]} ({rec.case or '-'}) shared its GPU: allocated and reserved "
                                    "scored, its device level (NVML per process) and step times left out")
            est, note = estimate_for(rec, stored)
            if note:
                loaded.notes.append(note)
            if est is not None:
                loaded.points.extend(points_of(rec, est, slug))
    return loaded


def same_gpu(wanted: str, slug: str, records: list[Record]) -> bool:
    """Whether a records file (named by its GPU's device-name slug: nvidia-h200) holds the GPU a user named — by that
    slug, or by a catalog name or alias of the GPU its records ran on (H200, H200-SXM)."""
    if slug == gpu_slug(wanted):
        return True
    info = next((r.gpu for r in records if r.gpu is not None), None)
    spec = gpu_for_device(info.gpu_name, info.memory_bytes) if info else None
    entry = catalog_entry(wanted)
    return spec is not None and entry is not None and spec.name == entry["name"]


def estimate_for(rec: Record, stored: bool) -> tuple[dict[str, Any] | None, str | None]:
    saved = dict(rec.estimate) if rec.estimate else None
    if stored:
        return saved, None if saved else f"record {rec.id[:8]}: no stored estimate"
    try:
        return estimate(record_job(rec)).to_json(), None
    except Exception as exc:  # noqa: BLE001 - an old record whose spec no longer builds keeps its stored estimate
        why = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
        if saved:
            return saved, f"record {rec.id[:8]}: re-estimate failed ({why}); used the stored estimate"
        return None, f"record {rec.id[:8]}: no estimate ({why})"


def record_job(rec: Record) -> Any:
    """The job as it ran: the record's spec, its allocator environment, and its GPU with today's calibration — the
    one the spec named (catalog or described), else the catalog GPU the probe ran on — so that the GPU's
    calibration and its cuBLAS workspace size apply."""
    import dataclasses

    job = rec.job_spec()
    info = rec.gpu
    if job.gpu is not None:
        return dataclasses.replace(job, gpu=recalibrated(job.gpu))
    gpu = gpu_for_device(info.gpu_name, info.memory_bytes) if info else None
    return dataclasses.replace(job, gpu=gpu) if gpu else job


def points_of(rec: Record, estimate: dict[str, Any], slug: str) -> list[Point]:
    per_gpu = estimate.get("per_gpu") or {}
    trainer, technique = rec.cell
    oom = rec.status == "oom"
    capacity = (rec.measured.oom.need_at_least_bytes if rec.measured.oom else None) or rec.run.capacity_bytes
    out = []
    for peak in PEAKS:
        predicted = per_gpu.get(PEAK_KEYS[peak])
        value = capacity if oom else rec.measured.peak(peak)
        if oom and peak != _oom_peak(rec):
            continue
        if peak == "device" and rec.shared_gpu:     # NVML's per-process figure: not the device level a job sees
            continue
        if predicted is None or not value:
            continue
        spread = (per_gpu.get("reserved_spread_bytes") or 0) if peak != "allocated" else 0
        out.append(Point(gpu=slug, trainer=trainer, technique=technique, peak=peak, predicted=float(predicted),
                         measured=float(value), censored=oom, record_id=rec.id, spread=float(spread)))
    return out


def _oom_peak(rec: Record) -> str:
    """What an OOM bounds: on CPU the tracked tensor bytes; on a GPU under --capacity-bytes the allocator's reserve
    (set_per_process_memory_fraction caps it); on a GPU at its own size the device (everything had to fit)."""
    if rec.device == "cpu":
        return "allocated"
    return "reserved" if rec.run.capacity_bytes else "device"

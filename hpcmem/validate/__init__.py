"""Accuracy of the estimator against its instruments: per trainer × technique cell and per peak, with a safe bound.

`against_probes(...)` reads probe records, re-estimates them, and returns the table (and, on request, fits and stores
the per-GPU calibration and draws the scatter). Stdlib apart from matplotlib for the PNG. The calibration loader the
estimator uses is `hpcmem.gpus.calibration.load_calibration`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcmem.datapath import estimator_dir
from hpcmem.validate import calibration
from hpcmem.validate.plot import scatter
from hpcmem.validate.probes import load
from hpcmem.validate.speed import held_out_ratios, rows_for, to_json
from hpcmem.validate.table import CellStats, table


@dataclass
class Report:
    rows: list[CellStats]
    notes: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    png: str | None = None
    calibrations: list[str] = field(default_factory=list)
    num_records: int = 0
    speed: list[Any] = field(default_factory=list)          # hpcmem.validate.speed.SpeedRow, with speed=True

    def to_json(self) -> dict[str, Any]:
        from dataclasses import asdict

        out = {"cells": [asdict(r) for r in self.rows], "notes": self.notes, "files": self.files, "png": self.png,
               "calibrations": self.calibrations, "num_records": self.num_records}
        if self.speed:
            out["speed"] = to_json(self.speed)
        return out


def against_probes(paths: list[str | Path] | None = None, *, png: str | Path | None = None, fit: bool = False,
                   stored: bool = False, gpu: str | None = None, fit_dir: str | Path | None = None,
                   speed: bool = False, extra: dict[str, Any] | None = None, fit_speed: bool = False,
                   score_since_fit: bool = False) -> Report:
    """`fit=True` stores each GPU's calibration in `fit_dir` (default: calibration.default_fit_dir()), with `extra`
    keys added to each file (a campaign's provenance); `speed=True` also holds the planner's throughput model to the
    timed runs (hpcmem.validate.speed), and a fit then carries the GPU's MFU curve when enough runs were timed.
    `fit_speed=True` refits only the MFU curve of each GPU's existing calibration (`calibration.with_throughput`);
    `score_since_fit=True` scores its margins on the runs made after it was fitted (`calibration.with_since_fit`)."""
    loaded = load(list(paths) if paths else [estimator_dir() / "probes"], stored=stored, gpu=gpu)
    report = Report(rows=[], notes=list(loaded.notes), files=loaded.files, num_records=len(loaded.records))
    if gpu and not loaded.records:
        report.notes.append(f"no records of GPU {gpu!r} in {', '.join(loaded.files) or 'no records file'} (each file "
                            "is named by the GPU its runs measured)")
    slugs = sorted({p.gpu for p in loaded.points})
    if speed or fit or fit_speed:
        report.speed = rows_for(loaded)
    if fit_speed:
        _fit_speed(report, slugs, Path(fit_dir) if fit_dir else calibration.default_fit_dir())
    if score_since_fit:
        _score_since_fit(report, loaded, slugs, Path(fit_dir) if fit_dir else calibration.default_fit_dir())
    if fit:
        for slug in slugs:
            recs = loaded.by_gpu.get(slug, [])
            cal = calibration.fit(recs, [p for p in loaded.points if p.gpu == slug], slug, loaded.files,
                                  speed=[r for r in report.speed if r.gpu == slug])
            folder = Path(fit_dir) if fit_dir else calibration.default_fit_dir()
            report.calibrations.append(str(calibration.save({**cal, **(extra or {})}, folder)))
    if not (speed or fit_speed):
        report.speed = []
    margins: dict[tuple[str, str], float] = {}
    for slug in slugs:
        found = calibration.margins_for(slug)
        if not found:
            report.notes.append(f"{slug}: uncalibrated (no calibrations/{slug}.json on the search path, "
                                "hpcmem.gpus.calibration): safe-bound margin 0")
        margins.update({(slug, peak): m for peak, m in found.items()})
    report.rows = table(loaded.points, margins)
    if png and loaded.points:
        report.png = str(scatter(loaded.points, png))
    return report


def _score_since_fit(report: Report, loaded: Any, slugs: list[str], folder: Path) -> None:
    for slug in slugs:
        cal = calibration.with_since_fit(slug, loaded.by_gpu.get(slug, []),
                                         [p for p in loaded.points if p.gpu == slug], folder)
        if cal is None:
            report.notes.append(f"{slug}: nothing scored (no calibration, or no run made after its fit)")
            continue
        report.calibrations.append(str(calibration.save(cal, folder)))
        for peak, got in cal["since_fit"].items():
            report.notes.append(f"{slug}: {peak} margin {100 * cal['margins'][peak]['margin']:.2f} % on the "
                                f"{got['n']} runs made after its fit ({got['after'][:10]}): {got['covered']} covered, "
                                f"largest need {got['worst_need_pct']:.2f} %")


def _fit_speed(report: Report, slugs: list[str], folder: Path) -> None:
    for slug in slugs:
        rows = [r for r in report.speed if r.gpu == slug]
        cal = calibration.with_throughput(slug, rows, folder)
        if cal is None:
            report.notes.append(f"{slug}: no MFU curve written (no calibration to add it to — fit one with --fit — "
                                "or fewer timed runs than the fit needs)")
            continue
        report.calibrations.append(str(calibration.save(cal, folder)))
        scored = held_out_ratios(rows)
        if scored:
            inside, loo = sorted(x[1] for x in scored), sorted(x[2] for x in scored)
            report.notes.append(f"{slug}: MFU curve mfu_max {cal['throughput']['mfu_max']:.3f}, half at "
                                f"{cal['throughput']['mfu_half_tokens']:,.0f} tokens, from {len(scored)} timed runs; "
                                f"predicted/measured in sample median {inside[len(inside) // 2]:.2f} "
                                f"({inside[0]:.2f}–{inside[-1]:.2f}), each run left out of its own fit median "
                                f"{loo[len(loo) // 2]:.2f} ({loo[0]:.2f}–{loo[-1]:.2f})")

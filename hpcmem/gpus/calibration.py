"""Per-GPU calibrations from probe records, served to the estimate (stdlib only; the fitting is hpcmem.validate).

A calibration is one JSON file per GPU model, `<gpu-slug>.json` (context bytes, allocator fit, safe-bound margins per
peak, provenance; written by `hpcmem validate probes --fit`). Files are looked up in the `calibrations`
folders of the site-data search path (hpcmem.datapath), first match per GPU wins:

    $HPCMEM_DATA/calibrations → /etc/hpcmem/calibrations → ~/.config/hpcmem/calibrations → hpcmem/calibrations/

The last folder ships in the wheel, so an installed hpcmem is calibrated wherever it runs; a site that probes its
own GPUs puts its files in one of the others and they take precedence for those GPUs.

Margins: a calibrated GPU has its own per peak. A GPU without a calibration borrows, per peak, the largest margin of
every calibrated GPU on the search path (`default_margins`), marked `default` — the spread other GPUs' runs showed,
not a measurement of this GPU.

Published margins: `multi-gpu.json` and `single-gpu.json` in the same folders (first match wins; written by `hpcmem
validate published --fit-margin`, hpcmem.validate.published_margin) hold the device margins fitted on published
multi-GPU and single-GPU rows, with their leave-one-source-out coverage. They are not a GPU's calibration:
`calibration_files` leaves them out.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hpcmem.datapath import search_dirs
from hpcmem.gpus.catalog import catalog_entry, gpu_slug
from hpcmem.gpus.spec import Campaign, PeakMargin

KIND = "calibrations"
MULTI_GPU_FILE = "multi-gpu.json"
SINGLE_GPU_FILE = "single-gpu.json"
PUBLISHED_FILES = (MULTI_GPU_FILE, SINGLE_GPU_FILE)


def calibration_files() -> list[Path]:
    """Every GPU calibration file on the search path, highest priority first."""
    return [p for d in search_dirs(KIND) if d.is_dir() for p in sorted(d.glob("*.json"))
            if p.name not in PUBLISHED_FILES]


def multi_gpu_margin() -> PeakMargin | None:
    """The device margin fitted on published multi-GPU rows (module docstring), or None when no file is found."""
    return _published_margin(MULTI_GPU_FILE, "multi-GPU")


def single_gpu_margin() -> PeakMargin | None:
    """The device margin fitted on published single-GPU rows (module docstring), or None when no file is found."""
    return _published_margin(SINGLE_GPU_FILE, "single-GPU")


def _published_margin(name: str, what: str) -> PeakMargin | None:
    for d in search_dirs(KIND):
        data = _read(d / name)
        if data is None:
            continue
        try:
            held = data["held_out"]
            sources = len(data["evidence"]["sources"])
            return PeakMargin(peak=str(data.get("peak", "device")), margin=float(data["margin"]),
                              coverage=float(data["coverage"]), n=int(data["n"]),
                              calibrated_on=f"published {what} rows ({sources} source{'s' * (sources != 1)})",
                              default=False, evidence=f"published {what} rows",
                              held_out_covered=int(held["covered"]), held_out_n=int(held["n"]))
        except (KeyError, TypeError, ValueError):
            continue
    return None


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _names(path: Path, data: dict[str, Any]) -> set[str]:
    return {path.stem, gpu_slug(data.get("catalog_name")), *map(gpu_slug, data.get("device_names", []))} - {"cpu"}


def load_calibration(gpu_name: str | None, first: Path | None = None) -> dict[str, Any] | None:
    """The calibration of a GPU model (catalog name, alias, or the driver's name such as "NVIDIA H100 80GB HBM3"),
    or None when it was never probed; the folder `first`, when given, is looked in before the search path (where a
    refit writes: its own file is the one to update). `_path` in the result says which file was read."""
    wanted = {gpu_slug(gpu_name)}
    entry = catalog_entry(gpu_name or "")
    if entry is not None:
        wanted |= {gpu_slug(n) for n in [entry["name"], *entry.get("aliases", [])]}
    own = sorted(Path(first).glob("*.json")) if first is not None and Path(first).is_dir() else []
    for path in [p for p in own if p.name not in PUBLISHED_FILES] + calibration_files():
        data = _read(path)
        if data is None:
            continue
        if wanted & _names(path, data) or (gpu_slug(gpu_name) == "cpu" and path.stem == "cpu"):
            return {**data, "_path": str(path)}
    return None


def peak_margins(calibration: dict[str, Any], *, default: bool = False) -> dict[str, PeakMargin]:
    """The safe-bound margins of one calibration file, per peak."""
    on = str(calibration.get("catalog_name") or calibration.get("gpu") or "?")
    out = {}
    for peak, m in (calibration.get("margins") or {}).items():
        held = (calibration.get("held_out") or {}).get(peak) or {}
        since = _since_fit(calibration, peak)
        try:
            held_n = int(held.get("n", 0))
            # held-out runs the bound covered: the fit reports their under-estimate rate (hpcmem.validate.calibration)
            held_covered = round(held_n * (1 - float(held.get("under_rate_pct", 0.0)) / 100))
            out[peak] = PeakMargin(peak=peak, margin=float(m["margin"]), coverage=float(m["coverage"]),
                                   n=int(m["n"]), calibrated_on=on, default=default, held_out_n=held_n,
                                   held_out_covered=held_covered, since_fit_n=int(since.get("n", 0)),
                                   since_fit_covered=int(since.get("covered", 0)))
        except (KeyError, TypeError, ValueError):
            continue
    return out


def _since_fit(calibration: dict[str, Any], peak: str) -> dict[str, Any]:
    """A peak's tally of runs made after the fit (hpcmem.validate.calibration `since_fit`), or {} where it does not
    belong to this fit (scored against another `fitted_at`) or does not add up (0 ≤ covered ≤ n)."""
    since = (calibration.get("since_fit") or {}).get(peak)
    fitted = (calibration.get("provenance") or {}).get("fitted_at")
    try:
        n, covered = int(since["n"]), int(since["covered"])
        return since if since.get("after") == fitted and 0 <= covered <= n else {}
    except (KeyError, TypeError, ValueError):
        return {}


def campaign_of(calibration: dict[str, Any]) -> Campaign | None:
    """The campaign a calibration file names (`hpcmem calibrate --collect` writes it), or None (a fit by hand)."""
    c = calibration.get("campaign")
    try:
        return Campaign(name=str(c["name"]), site=str(c["site"]), date=str(c["date"]), n=int(c["n"]),
                        device=str(c.get("device", "cuda"))) if isinstance(c, dict) else None
    except (KeyError, TypeError, ValueError):
        return None


def default_margins() -> dict[str, PeakMargin]:
    """Per peak, the largest margin of any GPU calibrated on a GPU (context measured) on the search path; the first
    file per GPU counts."""
    seen: set[str] = set()
    best: dict[str, PeakMargin] = {}
    for path in calibration_files():
        data = _read(path)
        if data is None or path.stem == "cpu" or not data.get("catalog_name") or "context_bytes" not in data:
            continue
        key = str(data["catalog_name"])
        if key in seen:
            continue        # a site file shadows the package's for the same GPU
        seen.add(key)
        for peak, m in peak_margins(data, default=True).items():
            if peak not in best or m.margin > best[peak].margin:
                best[peak] = m
    return best

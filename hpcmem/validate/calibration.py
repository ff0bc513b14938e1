"""Fit the per-GPU calibration from probe records and save it as data with its provenance (stdlib only).

One file per GPU model, `<gpu-slug>.json`; hpcmem.gpus.calibration serves it to the estimate from the site-data search
path. What is fitted, on the training split only:
  context        device − reserved at the peak: CUDA context, cuBLAS/cuDNN, NCCL, everything outside PyTorch's
                 allocator; per driver version (median, p95, n)
  allocator      reserved ≈ a · allocated + b, per expandable_segments setting (least squares)
  margins        per peak, the safe-bound margin m: upper · (1 + m) covers the run, upper = predicted + half the
                 estimate's reserved spread (hpcmem.estimate.verdict; 0 for allocated). With n training runs, the
                 needed margins max(0, measured / upper − 1) are sorted and the k-th smallest is taken, k =
                 min(n, ⌈TARGET_COVERAGE · (n + 1)⌉). A new run exchangeable with these is then covered with
                 probability ≥ k / (n + 1) (the split-conformal bound: Vovk et al. 2005; Lei et al. 2018 "Distribution-
                 Free Predictive Inference for Regression" §2.2), and that k / (n + 1) — not the target — is the
                 `coverage` stored: 18 runs give the largest of 18 and 18/19 = 94.7 %, 98 % needs n ≥ 49. An OOM
                 run adds its lower bound (capacity / predicted − 1).
The split is deterministic: a record whose sha1(id) is 0 mod HOLDOUT_EVERY is held out; the file reports how the
fitted constants do on the held-out runs.

Where `save` writes (`default_fit_dir`): the first `$HPCMEM_DATA` folder when that is set; else, in a source checkout
(pyproject.toml beside the package), the package's own hpcmem/calibrations/ — the files that ship; else the user's
~/.config/hpcmem/calibrations.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any

from hpcmem.datapath import ENV_DATA, PACKAGE_DIR, write_dir
from hpcmem.errors import HpcmemError
from hpcmem.gpus.calibration import KIND, load_calibration, peak_margins
from hpcmem.gpus.catalog import catalog_name_for, gpu_slug
from hpcmem.record import Record
from hpcmem.validate.speed import fit_mfu
from hpcmem.validate.table import PEAKS, Point, median, quantile

HOLDOUT_EVERY = 5
TARGET_COVERAGE = 0.98  # the safe bound should under-estimate ≤ 2 % of runs; what n allows is stored as `coverage`
SCHEMA = 1


def default_fit_dir() -> Path:
    """Where `hpcmem validate --fit` writes (module docstring)."""
    if any(p.strip() for p in os.environ.get(ENV_DATA, "").split(os.pathsep)):
        return write_dir(KIND)
    if (PACKAGE_DIR.parent / "pyproject.toml").is_file():
        return PACKAGE_DIR / KIND
    return write_dir(KIND)


def held_out(record_id: str) -> bool:
    return int(hashlib.sha1(record_id.encode()).hexdigest(), 16) % HOLDOUT_EVERY == 0


def _portable(path: str) -> str:
    """A source path as the shipped calibration keeps it: relative to the working directory when under it (a
    checkout's estimator/probes/…), so no machine's absolute path is written into a file others install."""
    p = Path(path).resolve()
    try:
        return p.relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return str(path)


def fit(records: list[Record], points: list[Point], gpu: str, sources: list[str],
        speed: list[Any] | None = None) -> dict[str, Any]:
    """Fit one GPU's constants from its records and the estimate/measurement points made from them; with `speed`
    rows (hpcmem.validate.speed) also the throughput model's MFU curve when enough runs timed their steps."""
    ok = [r for r in records if r.status == "ok" and not r.repeat_of]     # a repeat's context is its original's
    train_ids = {r.id for r in records if not held_out(r.id)}
    train = [p for p in points if p.record_id in train_ids]
    test = [p for p in points if p.record_id not in train_ids]
    margins = {peak: _margin([p for p in train if p.peak == peak]) for peak in PEAKS}
    devices = sorted({str(r.gpu_name) for r in records if r.gpu})
    memory = next((int(r.gpu.memory_bytes or 0) for r in records if r.gpu), None)
    catalog_name = catalog_name_for(devices[0], memory) if devices else None
    context = _context([r for r in ok if r.id in train_ids])
    main_driver = max(context, key=lambda d: context[d]["n"]) if context else None
    fitted_at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    return {
        "schema": SCHEMA, "gpu": gpu_slug(catalog_name) if catalog_name else gpu, "catalog_name": catalog_name,
        "device_names": devices,
        **({"context_bytes": context[main_driver]["median_bytes"]} if main_driver else {}),
        "source": f"{len(records)} probe records ({gpu}), driver {main_driver or '-'}, fitted {fitted_at[:10]}",
        "provenance": {
            "fitted_at": fitted_at,
            "sources": [_portable(s) for s in sources], "num_records": len(records),
            "num_train_records": len(train_ids), "num_test_records": len(records) - len(train_ids),
            "split": f"held out when sha1(record id) % {HOLDOUT_EVERY} == 0",
            "record_ids_sha1": hashlib.sha1("".join(sorted(r.id for r in records)).encode()).hexdigest(),
            "versions": _versions(records),
        },
        "context": context,
        "allocator": _allocator([r for r in ok if r.id in train_ids]),
        "margins": {k: v for k, v in margins.items() if v is not None},
        "held_out": _held_out_report(test, margins),
        **({"throughput": mfu} if (mfu := fit_mfu(speed or [])) else {}),
    }


def with_throughput(gpu: str, speed: list[Any], folder: Path | None = None) -> dict[str, Any] | None:
    """The GPU's calibration on the search path with only its MFU curve refitted from `speed` (its timed runs);
    context, allocator and margins stay as they were fitted, so records that did not fit them stay out of sample.
    None when the GPU has no calibration yet (fit one first) or too few timed runs. The calibration in `folder`
    (where the result is written) is the one updated when it has one for the GPU."""
    current, mfu = load_calibration(gpu, folder), fit_mfu(speed)
    if current is None or mfu is None:
        return None
    current.pop("_path", None)
    return {**current, "throughput": mfu}


def since_fit(calibration: dict[str, Any], records: list[Record], points: list[Point]) -> dict[str, Any]:
    """Per peak, the runs made after the calibration was fitted (`created` later than `provenance.fitted_at`), so
    never in its fit, scored against its margins: how many the bound (upper outcome · (1 + margin)) covered, and the
    largest margin one of them needed. OOM runs are left out (a bound on their need is the boundary report's)."""
    after = str((calibration.get("provenance") or {}).get("fitted_at") or "")
    late = {r.id for r in records if after and (r.created or "") > after}
    out: dict[str, Any] = {}
    for peak, m in (calibration.get("margins") or {}).items():
        pts = [p for p in points if p.peak == peak and p.record_id in late and not p.censored]
        if not pts:
            continue
        needs = [max(0.0, p.measured / p.upper - 1.0) for p in pts]
        out[peak] = {"n": len(pts), "covered": sum(need <= float(m["margin"]) for need in needs),
                     "worst_need_pct": round(100 * max(needs), 3), "after": after}
    return out


def with_since_fit(gpu: str, records: list[Record], points: list[Point],
                   folder: Path | None = None) -> dict[str, Any] | None:
    """The GPU's calibration — the one in `folder` (where the result is written) when it has one, else the search
    path's — with `since_fit` (above) scored anew; its margins, context, allocator and MFU curve as they were. None
    when the GPU has no calibration or no run was made after its fit."""
    current = load_calibration(gpu, folder)
    if current is None:
        return None
    current.pop("_path", None)
    scored = since_fit(current, records, points)
    return {**current, "since_fit": scored} if scored else None


def save(calibration: dict[str, Any], folder: Path) -> Path:
    path = Path(folder) / f"{calibration['gpu']}.json"
    tmp = path.with_suffix(".json.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(calibration, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        tmp.replace(path)
    except OSError as exc:
        raise HpcmemError(f"calibration folder {str(folder)!r}: cannot write {path.name} ({exc.strerror or exc})") \
            from None
    return path


def margins_for(gpu: str) -> dict[str, float]:
    """The safe-bound margin per peak of a GPU's calibration on the search path (empty when uncalibrated)."""
    cal = load_calibration(gpu)
    return {peak: m.margin for peak, m in peak_margins(cal).items()} if cal else {}


def _margin(points: list[Point]) -> dict[str, Any] | None:
    """The conformal safe-bound margin of one peak (module docstring; an OOM run's need is ≥ capacity)."""
    return conformal_margin([max(0.0, p.measured / p.upper - 1.0) for p in points])


def conformal_margin(needs: list[float]) -> dict[str, Any] | None:
    """The k-th smallest of the needed margins, k = min(n, ⌈TARGET_COVERAGE · (n + 1)⌉), and its coverage
    k / (n + 1) (module docstring); None without any."""
    if not needs:
        return None
    needed = sorted(needs)
    n = len(needed)
    k = min(n, math.ceil(TARGET_COVERAGE * (n + 1)))
    return {"margin": round(needed[k - 1], 6), "n": n, "k": k, "coverage": round(k / (n + 1), 4),
            "target_coverage": TARGET_COVERAGE}


def _held_out_report(test: list[Point], margins: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for peak in PEAKS:
        pts = [p for p in test if p.peak == peak and not p.censored]
        m = (margins.get(peak) or {}).get("margin")
        if not pts or m is None:
            continue
        bounds = [p.upper * (1 + m) for p in pts]
        out[peak] = {"n": len(pts), "median_abs_err_pct": round(median([abs(p.err_pct) for p in pts]), 3),
                     "under_rate_pct": round(100.0 * sum(b < p.measured for b, p in zip(bounds, pts)) / len(pts), 3),
                     "median_slack_pct": round(median([100 * (b - p.measured) / p.measured
                                                       for b, p in zip(bounds, pts)]), 3)}
    return out


def _context(records: list[Record]) -> dict[str, Any]:
    by_driver: dict[str, list[int]] = {}
    for r in records:
        m = r.measured
        if m.device_peak_bytes and m.peak_reserved_bytes:
            driver = str((r.gpu.driver if r.gpu else None) or "unknown")
            by_driver.setdefault(driver, []).append(m.device_peak_bytes - m.peak_reserved_bytes)
    return {d: {"median_bytes": int(median(v)), "p95_bytes": int(quantile(v, 0.95)), "n": len(v)}
            for d, v in sorted(by_driver.items())}


def _allocator(records: list[Record]) -> dict[str, Any]:
    groups: dict[str, list[tuple[float, float]]] = {}
    for r in records:
        m = r.measured
        if m.peak_reserved_bytes and m.peak_allocated_bytes:
            key = "expandable_segments" if r.expandable else "default"
            groups.setdefault(key, []).append((float(m.peak_allocated_bytes), float(m.peak_reserved_bytes)))
    return {k: _linear(v) for k, v in sorted(groups.items())}


def _linear(xy: list[tuple[float, float]]) -> dict[str, Any]:
    """reserved = a · allocated + b by least squares (a = mean ratio, b = 0 with one distinct x)."""
    n = len(xy)
    mx = sum(x for x, _ in xy) / n
    my = sum(y for _, y in xy) / n
    sxx = sum((x - mx) ** 2 for x, _ in xy)
    if sxx == 0:
        a, b = my / mx if mx else 1.0, 0.0
    else:
        a = sum((x - mx) * (y - my) for x, y in xy) / sxx
        b = my - a * mx
    return {"slope": round(a, 6), "intercept_bytes": int(b), "n": n,
            "median_ratio": round(median([y / x for x, y in xy if x]), 6)}


def _versions(records: list[Record]) -> dict[str, list[str]]:
    out: dict[str, set[str]] = {}
    for r in records:
        for k, v in r.versions.items():
            if v:
                out.setdefault(k, set()).add(str(v))
    return {k: sorted(v) for k, v in sorted(out.items())}

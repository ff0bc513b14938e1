"""Calibrated constants fitted from probe records, stored as data with their provenance (stdlib only).

One file per GPU model: estimator/calibration/<gpu-slug>.json. What is fitted, on the training split only:
  context        device − reserved at the peak: CUDA context, cuBLAS/cuDNN, NCCL, everything outside PyTorch's
                 allocator; per driver version (median, p95, n)
  allocator      reserved ≈ a · allocated + b, per expandable_segments setting (least squares)
  margins        per peak: the smallest m such that predicted · (1 + m) covers ≥ COVERAGE of the training runs
The split is deterministic: a record whose sha1(id) is 0 mod HOLDOUT_EVERY is held out; the file reports how the
fitted constants do on the held-out runs. `load_calibration(gpu_name)` is what the estimator calls; with no file for
a GPU it returns None and the estimate says "uncalibrated".
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from pathlib import Path
from typing import Any

from hpcmem.probe.record import estimator_dir, gpu_slug, ran_expandable
from hpcmem.validate.table import PEAKS, Point, median, quantile

HOLDOUT_EVERY = 5
COVERAGE = 0.98        # ACCURACY.md: the safe bound under-estimates ≤ 2 % of runs
SCHEMA = 1


def calibration_dir(root: Path | None = None) -> Path:
    return (root or estimator_dir()) / "calibration"


def load_calibration(gpu_name: str | None, root: Path | None = None) -> dict[str, Any] | None:
    """The calibration of a GPU model, or None when it was never probed.

    `gpu_name` may be the catalog name or an alias (hpcmem/gpus.json: "H100-80GB", "H100") or the name the driver
    reports ("NVIDIA H100 80GB HBM3"). Besides the fitted tables the dict has `context_bytes` (the median context of
    the driver with most records) and `source` (one line of provenance), which hpcmem.gpus reads.
    """
    folder = calibration_dir(root)
    if not folder.is_dir():
        return None
    wanted = {gpu_slug(gpu_name)}
    entry = catalog_entry(gpu_name or "")
    if entry is not None:
        wanted |= {gpu_slug(n) for n in [entry["name"], *entry.get("aliases", [])]}
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        names = {path.stem, gpu_slug(data.get("catalog_name")), *map(gpu_slug, data.get("device_names", []))}
        if wanted & (names - {"cpu"}) or (gpu_slug(gpu_name) == "cpu" and path.stem == "cpu"):
            return data
    return None


def catalog_entry(name: str) -> dict[str, Any] | None:
    """The hpcmem/gpus.json entry for a catalog name or alias (read here: hpcmem.gpus itself calls us)."""
    key = name.strip().lower()
    for entry in _gpu_catalog():
        if key in {n.lower() for n in [entry["name"], *entry.get("aliases", [])]}:
            return entry
    return None


def catalog_name_for(device_name: str | None, memory_bytes: int | None) -> str | None:
    """Which catalog GPU a driver-reported name is: its model token ("H100") in the name, the variant tokens (PCIe,
    NVL) agreeing, and the memory within 8 % of the catalog's."""
    if not device_name:
        return None
    text = device_name.lower().replace(" ", "-")
    best, best_score = None, -1
    for entry in _gpu_catalog():
        tokens = entry["name"].lower().split("-")
        if tokens[0] not in text:
            continue
        if memory_bytes and abs(entry["memory_bytes"] - memory_bytes) > 0.08 * entry["memory_bytes"]:
            continue
        variants = [t for t in ("pcie", "nvl", "sxm") if t in text]
        score = sum(t in tokens for t in variants) - sum(t not in text for t in tokens[1:] if not t.endswith("gb"))
        if score > best_score:
            best, best_score = entry["name"], score
    return best


def _gpu_catalog() -> list[dict[str, Any]]:
    from importlib import resources

    return json.loads(resources.files("hpcmem").joinpath("gpus.json").read_text())["gpus"]


def held_out(record_id: str) -> bool:
    return int(hashlib.sha1(record_id.encode()).hexdigest(), 16) % HOLDOUT_EVERY == 0


def fit(records: list[dict[str, Any]], points: list[Point], gpu: str, sources: list[str]) -> dict[str, Any]:
    """Fit one GPU's constants from its records and the estimate/measurement points made from them."""
    ok = [r for r in records if r.get("status") == "ok"]
    train_ids = {str(r.get("id")) for r in records if not held_out(str(r.get("id")))}
    train = [p for p in points if p.record_id in train_ids]
    test = [p for p in points if p.record_id not in train_ids]
    margins = {peak: _margin([p for p in train if p.peak == peak]) for peak in PEAKS}
    devices = sorted({str((r.get("gpu") or {}).get("gpu_name")) for r in records if r.get("gpu")})
    memory = next((int((r.get("gpu") or {}).get("memory_bytes") or 0) for r in records if r.get("gpu")), None)
    catalog_name = catalog_name_for(devices[0], memory) if devices else None
    context = _context([r for r in ok if str(r.get("id")) in train_ids])
    main_driver = max(context, key=lambda d: context[d]["n"]) if context else None
    fitted_at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    return {
        "schema": SCHEMA, "gpu": gpu_slug(catalog_name) if catalog_name else gpu, "catalog_name": catalog_name,
        "device_names": devices,
        **({"context_bytes": context[main_driver]["median_bytes"]} if main_driver else {}),
        "source": f"{len(records)} probe records ({gpu}), driver {main_driver or '-'}, fitted {fitted_at[:10]}",
        "provenance": {
            "fitted_at": fitted_at,
            "sources": sources, "num_records": len(records),
            "num_train_records": len(train_ids), "num_test_records": len(records) - len(train_ids),
            "split": f"held out when sha1(record id) % {HOLDOUT_EVERY} == 0",
            "record_ids_sha1": hashlib.sha1("".join(sorted(str(r.get("id")) for r in records)).encode()).hexdigest(),
            "versions": _versions(records),
        },
        "context": context,
        "allocator": _allocator([r for r in ok if str(r.get("id")) in train_ids]),
        "margins": {k: v for k, v in margins.items() if v is not None},
        "held_out": _held_out_report(test, margins),
    }


def save(calibration: dict[str, Any], root: Path | None = None) -> Path:
    path = calibration_dir(root) / f"{calibration['gpu']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(calibration, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def margins_for(gpu: str, root: Path | None = None) -> dict[str, float]:
    cal = load_calibration(gpu, root)
    return {k: float(v["margin"]) for k, v in (cal or {}).get("margins", {}).items()}


def _margin(points: list[Point]) -> dict[str, Any] | None:
    """Smallest margin covering COVERAGE of the runs (censored runs: their capacity must be covered too)."""
    if not points:
        return None
    needed = sorted(max(0.0, p.measured / p.predicted - 1.0) for p in points)
    return {"margin": round(quantile(needed, COVERAGE), 6), "n": len(points), "coverage": COVERAGE}


def _held_out_report(test: list[Point], margins: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for peak in PEAKS:
        pts = [p for p in test if p.peak == peak and not p.censored]
        m = (margins.get(peak) or {}).get("margin")
        if not pts or m is None:
            continue
        bounds = [p.predicted * (1 + m) for p in pts]
        out[peak] = {"n": len(pts), "median_abs_err_pct": round(median([abs(p.err_pct) for p in pts]), 3),
                     "under_rate_pct": round(100.0 * sum(b < p.measured for b, p in zip(bounds, pts)) / len(pts), 3),
                     "median_slack_pct": round(median([100 * (b - p.measured) / p.measured
                                                       for b, p in zip(bounds, pts)]), 3)}
    return out


def _context(records: list[dict[str, Any]]) -> dict[str, Any]:
    by_driver: dict[str, list[int]] = {}
    for r in records:
        m = r.get("measured") or {}
        if m.get("device_peak_bytes") and m.get("peak_reserved_bytes"):
            driver = str((r.get("gpu") or {}).get("driver") or "unknown")
            by_driver.setdefault(driver, []).append(int(m["device_peak_bytes"]) - int(m["peak_reserved_bytes"]))
    return {d: {"median_bytes": int(median(v)), "p95_bytes": int(quantile(v, 0.95)), "n": len(v)}
            for d, v in sorted(by_driver.items())}


def _allocator(records: list[dict[str, Any]]) -> dict[str, Any]:
    groups: dict[str, list[tuple[float, float]]] = {}
    for r in records:
        m = r.get("measured") or {}
        if m.get("peak_reserved_bytes") and m.get("peak_allocated_bytes"):
            key = "expandable_segments" if ran_expandable(r.get("job"), r.get("env")) else "default"
            groups.setdefault(key, []).append((float(m["peak_allocated_bytes"]), float(m["peak_reserved_bytes"])))
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


def _versions(records: list[dict[str, Any]]) -> dict[str, list[str]]:
    out: dict[str, set[str]] = {}
    for r in records:
        for k, v in (r.get("versions") or {}).items():
            if v:
                out.setdefault(k, set()).add(str(v))
    return {k: sorted(v) for k, v in sorted(out.items())}

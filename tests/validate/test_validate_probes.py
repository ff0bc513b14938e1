"""`hpcmem validate --against probes` on synthetic records (fast tier, no torch): statistics, safe bound,
calibration with a held-out split and provenance, the PNG, and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpcmem.gpus.calibration import load_calibration
from hpcmem.record import append_record, job_to_dict
from hpcmem.validate import against_probes
from hpcmem.validate.calibration import held_out
from hpcmem.validate.table import Point, cell_stats, median, quantile

GIB = 1024**3


def _job(trainer: str, **settings):
    from hpcmem.job.trl_config import build_job

    job, _ = build_job(trainer, {"model_name_or_path": "Qwen/Qwen2.5-0.5B", "dtype": "bfloat16", **settings})
    return job


def _record(i: int, job, *, alloc: float, err_pct: float, status: str = "ok", capacity: int | None = None) -> dict:
    """A GPU record whose stored estimate is off by err_pct on every peak (an OOM: the GPU's own capacity)."""
    predicted = {"peak_allocated_bytes": int(alloc * (1 + err_pct / 100)),
                 "peak_reserved_bytes": int(alloc * 1.1 * (1 + err_pct / 100)),
                 "device_peak_bytes": int((alloc * 1.1 + 0.5 * GIB) * (1 + err_pct / 100))}
    measured = {"peak_allocated_bytes": int(alloc), "peak_reserved_bytes": int(alloc * 1.1),
                "device_peak_bytes": int(alloc * 1.1 + 0.5 * GIB)}
    if status == "oom":
        measured["oom"] = {"need_at_least_bytes": capacity}
    return {"schema": 1, "id": f"rec{i:04d}", "source": "probe", "device": "cuda", "status": status,
            "gpu": {"gpu_name": "NVIDIA H100 80GB HBM3", "driver": "550.54"}, "job": job_to_dict(job),
            "run": {"capacity_bytes": None}, "estimate": {"per_gpu": predicted}, "measured": measured,
            "versions": {"torch": "2.13.0"}}


@pytest.fixture()
def records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HPCMEM_ESTIMATOR_DIR", str(tmp_path))
    monkeypatch.setenv("HPCMEM_DATA", str(tmp_path / "site"))     # --fit writes here, and it is searched first
    path = tmp_path / "probes" / "nvidia-h100-80gb-hbm3.jsonl"
    sft, lora, dpo = _job("sft"), _job("sft", use_peft=True), _job("dpo")
    errs = [-4.0, -2.0, 1.0, 3.0, 6.0]
    for i in range(20):
        job = (sft, lora, dpo)[i % 3]
        append_record(path, _record(i, job, alloc=(4 + i) * GIB, err_pct=errs[i % 5]))
    append_record(path, _record(99, sft, alloc=90 * GIB, err_pct=-10.0, status="oom", capacity=80 * GIB))
    return tmp_path


def test_quantiles_are_nearest_rank() -> None:
    assert median([3.0, 1.0, 2.0]) == 2.0 and median([1.0, 2.0, 3.0, 4.0]) == 2.5
    assert quantile([float(i) for i in range(1, 101)], 0.95) == 95.0
    assert quantile([1.0, 2.0], 0.95) == 2.0


def test_cell_stats_by_hand() -> None:
    pts = [Point(gpu="g", trainer="sft", technique="full+gc", peak="allocated", predicted=p, measured=100.0,
                 record_id=str(i)) for i, p in enumerate((96.0, 98.0, 101.0, 103.0, 106.0))]
    pts.append(Point(gpu="g", trainer="sft", technique="full+gc", peak="allocated", predicted=70.0, measured=80.0,
                     censored=True))
    s = cell_stats(pts, margin=0.05)
    assert (s.n, s.n_censored) == (5, 1)
    assert s.median_abs_err_pct == pytest.approx(3.0) and s.max_abs_err_pct == pytest.approx(6.0)
    assert s.p95_abs_err_pct == pytest.approx(6.0) and s.bias_pct == pytest.approx(0.8)
    # bound = 1.05 · predicted covers every measured run (100.8, 102.9, …); the OOM run's 73.5 < 80 is under
    assert s.under_rate_pct == pytest.approx(100 / 6)
    assert s.median_slack_pct == pytest.approx(median([0.8, 2.9, 6.05, 8.15, 11.3]))


def test_margin_and_bound_widen_the_upper_outcome() -> None:
    from hpcmem.validate.calibration import _margin

    # measured 104 against predicted 100 ± 4 (upper 102): needs 104 / 102 − 1 = 1.96 %, not 4 %
    pts = [Point(gpu="g", trainer="sft", technique="full+gc", peak="device", predicted=100.0, measured=104.0,
                 spread=4.0, record_id=str(i)) for i in range(3)]
    assert _margin(pts)["margin"] == pytest.approx(round(104 / 102 - 1, 6))
    assert cell_stats(pts, margin=0.019).under_rate_pct == pytest.approx(100.0)     # 102 · 1.019 = 103.94 < 104
    assert cell_stats(pts, margin=0.02).under_rate_pct == 0.0                       # 102 · 1.02 = 104.04


def test_table_per_cell_and_peak(records: Path) -> None:
    report = against_probes([records / "probes"], stored=True)
    cells = {(r.trainer, r.technique, r.peak): r for r in report.rows}
    assert {k[:2] for k in cells} == {("sft", "full+gc"), ("sft", "lora+gc"), ("dpo", "full+gc")}
    assert {k[2] for k in cells} == {"allocated", "reserved", "device"}
    full = cells[("sft", "full+gc", "device")]
    assert full.n == 7 and full.n_censored == 1          # the OOM bounds the device peak on a GPU run
    assert cells[("sft", "full+gc", "allocated")].n_censored == 0
    assert any("uncalibrated" in n for n in report.notes)


def test_fit_stores_calibration_with_provenance_and_held_out_split(records: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(records)       # a checkout's records: the shipped file names them relative to it
    report = against_probes([records / "probes"], stored=True, fit=True)
    # the driver's name is matched to the catalog's H100-80GB; either name (or an alias) finds the file
    assert report.calibrations == [str(records / "site" / "calibrations" / "h100-80gb.json")]
    cal = load_calibration("NVIDIA H100 80GB HBM3")
    assert cal is not None and cal["catalog_name"] == "H100-80GB" and load_calibration("H100") == cal
    assert cal["context_bytes"] == pytest.approx(0.5 * GIB, rel=1e-6) and "probe records" in cal["source"]
    prov = cal["provenance"]
    n_test = sum(held_out(f"rec{i:04d}") for i in [*range(20), 99])
    assert (prov["num_records"], prov["num_test_records"]) == (21, n_test) and "sha1" in prov["split"]
    assert prov["sources"] == ["probes/nvidia-h100-80gb-hbm3.jsonl"]     # no machine's absolute path
    assert cal["context"]["550.54"]["median_bytes"] == pytest.approx(0.5 * GIB, rel=1e-6)
    assert cal["allocator"]["default"]["slope"] == pytest.approx(1.1, rel=1e-3)
    # n < 49 training runs: the conformal margin is the largest need, here the worst training under-estimate (−4 %
    # → 1/0.96 − 1), stated at coverage n/(n+1), not the 98 % target
    allocated = cal["margins"]["allocated"]
    assert allocated["margin"] == pytest.approx(1 / 0.96 - 1, rel=1e-3)
    assert allocated["k"] == allocated["n"] and allocated["coverage"] == round(allocated["n"] / (allocated["n"] + 1), 4)
    assert cal["margins"]["device"]["margin"] >= 1 / 0.96 - 1
    calibrated = {(r.technique, r.peak): r for r in report.rows if r.trainer == "sft"}
    assert calibrated[("full+gc", "allocated")].under_rate_pct == 0.0
    assert load_calibration("NVIDIA B200") is None and load_calibration("B200") is None


def test_the_gpu_catalog_picks_up_the_calibration(records: Path) -> None:
    from hpcmem.gpus.lookup import gpu_spec

    assert not gpu_spec("H100-80GB").calibrated
    against_probes([records / "probes"], stored=True, fit=True)
    spec = gpu_spec("H100-80GB")
    assert spec.calibrated and spec.context_bytes == pytest.approx(0.5 * GIB, rel=1e-6)


def test_cli_prints_table_and_writes_png(records: Path) -> None:
    from hpcmem.cli import cli

    png = records / "scatter.png"
    res = CliRunner().invoke(cli, ["validate", "--against", "probes", "--stored", "--png", str(png)])
    assert res.exit_code == 0, res.output
    assert "med|err|%" in res.output and "lora+gc" in res.output and "dpo" in res.output
    assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    res = CliRunner().invoke(cli, ["validate", "--stored", "--no-png", "--json"])
    data = json.loads(res.output)
    assert data["num_records"] == 21 and data["png"] is None and len(data["cells"]) == 9


def test_re_estimates_with_the_current_estimator(records: Path) -> None:
    report = against_probes([records / "probes"])                  # not --stored: the estimator runs again
    assert report.rows and not [n for n in report.notes if "re-estimate failed" in n]


def test_trace_source_is_clear_when_missing(records: Path) -> None:
    import importlib.util

    from hpcmem.cli import (
        cli,
        main,  # noqa: F401 - the group is importable
    )

    res = CliRunner().invoke(cli, ["validate", "--against", "trace", "--no-png"])
    if importlib.util.find_spec("hpcmem.validate.trace") is None:
        assert res.exit_code != 0 and "not available yet" in str(res.exception)

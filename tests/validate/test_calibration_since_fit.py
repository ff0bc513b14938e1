"""Margins scored on runs made after their fit (`hpcmem validate probes --score-since-fit`): the tally by hand, the
shipped H200 calibration's tally equal to a fresh scoring of the committed records, and the verdict saying it."""

from __future__ import annotations

import json

from hpcmem.record import Record
from hpcmem.validate.calibration import since_fit
from hpcmem.validate.table import Point

CAL = {"provenance": {"fitted_at": "2026-12-01T00:00:00+00:00"}, "margins": {"device": {"margin": 0.02}}}


def _rec(ident: str, created: str) -> Record:
    return Record.from_json({"id": ident, "created": created, "status": "ok",
                             "job": {"model": {}, "train": {"trainer": "sft"}}, "measured": {}})


def _point(ident: str, predicted: float, measured: float, censored: bool = False) -> Point:
    return Point(gpu="g", trainer="sft", technique="full+gc", peak="device", predicted=predicted, measured=measured,
                 censored=censored, record_id=ident)


def test_only_runs_after_the_fit_are_scored_and_ooms_are_left_out():
    records = [_rec("old", "2026-11-30T10:00:00+00:00"), _rec("a", "2026-12-02T10:00:00+00:00"),
               _rec("b", "2026-12-03T10:00:00+00:00"), _rec("c", "2026-12-03T11:00:00+00:00")]
    points = [_point("old", 100, 150),            # needs 50 %, but was there at the fit: not scored
              _point("a", 100, 101),              # needs 1 % ≤ 2 %: covered
              _point("b", 100, 103),              # needs 3 %: not covered
              _point("c", 100, 200, censored=True)]   # ran out of memory: the boundary report's
    got = since_fit(CAL, records, points)["device"]
    assert (got["n"], got["covered"], got["worst_need_pct"]) == (2, 1, 3.0)
    assert since_fit({**CAL, "provenance": {}}, records, points) == {}      # no fit date: nothing is "after"


def test_the_shipped_h200_tally_is_the_committed_records_scored_today():
    from hpcmem.datapath import estimator_dir
    from hpcmem.gpus.calibration import load_calibration
    from hpcmem.validate.probes import load

    shipped = load_calibration("nvidia-h200")
    loaded = load([estimator_dir() / "probes" / "nvidia-h200.jsonl"], gpu="nvidia-h200")
    assert shipped["since_fit"] == since_fit(shipped, loaded.records, loaded.points)
    assert shipped["since_fit"]["device"]["n"] >= 20


def test_the_verdict_names_the_runs_since_the_fit(tmp_path, monkeypatch):
    from hpcmem.estimate.verdict import judge
    from hpcmem.gpus.lookup import gpu_spec

    folder = tmp_path / "site" / "calibrations"
    folder.mkdir(parents=True)
    (folder / "h200.json").write_text(json.dumps({
        "catalog_name": "H200", "gpu": "h200", "context_bytes": 1_000_000_000, "source": "test",
        "provenance": {"fitted_at": "2026-12-01"},
        "margins": {"device": {"margin": 0.02, "n": 30, "k": 30, "coverage": round(30 / 31, 4)}},
        "since_fit": {"device": {"n": 5, "covered": 4, "worst_need_pct": 2.5, "after": "2026-12-01"}}}))
    monkeypatch.setenv("HPCMEM_DATA", str(tmp_path / "site"))
    v = judge(10 * 1024**3, gpu_spec("H200"))
    assert "runs since the fit: 4/5 covered" in v.line()
    assert v.calibration.to_json()["since_fit"] == {"covered": 4, "n": 5}


def test_a_tally_that_does_not_belong_to_the_fit_or_does_not_add_up_is_not_shown(tmp_path, monkeypatch):
    from hpcmem.estimate.verdict import judge
    from hpcmem.gpus.lookup import gpu_spec

    folder = tmp_path / "site" / "calibrations"
    folder.mkdir(parents=True)
    base = {"catalog_name": "H200", "gpu": "h200", "context_bytes": 1_000_000_000, "source": "test",
            "provenance": {"fitted_at": "2026-12-04"},
            "margins": {"device": {"margin": 0.02, "n": 30, "k": 30, "coverage": round(30 / 31, 4)}}}
    monkeypatch.setenv("HPCMEM_DATA", str(tmp_path / "site"))
    for tally in ({"n": 5, "covered": 4, "after": "2026-12-01"},       # scored against another fit
                  {"n": 5, "covered": 9, "after": "2026-12-04"},       # more covered than scored
                  {"n": "x", "covered": 1, "after": "2026-12-04"}):
        (folder / "h200.json").write_text(json.dumps({**base, "since_fit": {"device": tally}}))
        assert "since the fit" not in judge(10 * 1024**3, gpu_spec("H200")).line()
    (folder / "h200.json").write_text(json.dumps({**base, "since_fit": {"device": {"n": 5, "covered": 4,
                                                                                    "after": "2026-12-04"}}}))
    assert "runs since the fit: 4/5 covered" in judge(10 * 1024**3, gpu_spec("H200")).line()

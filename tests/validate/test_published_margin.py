"""The multi-GPU margin from published rows: leave-one-source-out scoring by hand on a tiny table, what counts as
evidence, and the shipped file's provenance."""

from __future__ import annotations

import json
from importlib import resources

import pytest

from hpcmem.validate.published import load
from hpcmem.validate.published_margin import evidence, fit, leave_one_source_out
from hpcmem.validate.published_score import Scored, score


def _row(rid: str, source: str, measured: float, estimated: float, *, gpus: int = 2, peak: str = "device",
         adjusted: bool = True) -> Scored:
    return Scored(id=rid, source=source, loop="x", gpus=gpus, gpu="G", technique="LoRA", peak=peak,
                  measured_gib=measured, estimated_gib=estimated, error_pct=0.0, verdict="fits", outcome="ran",
                  fits_agrees=True, raw=False, adjusted_gib=estimated if adjusted else None)


# needs (measured / estimated − 1): A 0.10 and 0.05, B 0.20, C 0 (over-estimated)
TABLE = [_row("a1", "A", 11.0, 10.0), _row("a2", "A", 10.5, 10.0), _row("b1", "B", 12.0, 10.0),
         _row("c1", "C", 9.0, 10.0)]


def test_leave_one_source_out_by_hand() -> None:
    # with n < 49 the conformal margin is the largest need (k = n at 98 %); so without A: max(0.20, 0) = 0.20 covers
    # both of A's rows; without B: max(0.10, 0.05, 0) = 0.10, and B's 12 > 10 · 1.10; without C: 0.20 covers C
    by_source = {s["source"]: s for s in leave_one_source_out(TABLE)}
    assert {k: (pytest.approx(v["margin"]), v["covered"], v["n"]) for k, v in by_source.items()} == {
        "A": (pytest.approx(0.20), 2, 2), "B": (pytest.approx(0.10), 0, 1), "C": (pytest.approx(0.20), 1, 1)}
    assert by_source["B"]["not_covered"] == ["b1"]
    m = fit(TABLE)
    assert m["margin"] == pytest.approx(0.20) and m["n"] == 4 and m["coverage"] == pytest.approx(4 / 5)
    assert m["held_out"]["covered"] == 3 and m["held_out"]["n"] == 4
    assert m["evidence"]["largest_need"] == "b1" and m["evidence"]["sources"] == ["A", "B", "C"]


def test_evidence_is_multi_gpu_bounding_peaks_with_a_loop_adjusted_estimate() -> None:
    rows = [*TABLE, _row("one", "A", 20.0, 10.0, gpus=1), _row("alloc", "B", 20.0, 10.0, peak="allocated"),
            _row("other", "C", 20.0, 10.0, adjusted=False)]
    assert [p.id for p in evidence(rows)] == ["a1", "a2", "b1", "c1"]
    assert fit([_row("one", "A", 20.0, 10.0, gpus=1)]) is None


def test_the_spread_is_in_what_the_margin_widens() -> None:
    # measured 11 over an estimate of 10 with a 2 GiB spread: upper = 11, so nothing is needed
    row = Scored(**{**_row("s", "A", 11.0, 10.0).__dict__, "spread_gib": 2.0})
    assert fit([row])["margin"] == 0.0


def test_the_shipped_multi_gpu_margin_says_where_it_comes_from() -> None:
    data = json.loads(resources.files("hpcmem").joinpath("calibrations/multi-gpu.json").read_text())
    assert data["held_out"]["method"] == "leave one source out"
    assert len(data["evidence"]["sources"]) >= 2 and data["n"] == len(data["evidence"]["rows"]) >= 8
    assert data["held_out"]["n"] == data["n"] and 0 <= data["held_out"]["covered"] <= data["n"]


def test_single_gpu_rows_fit_their_own_margin_and_one_source_holds_nothing_out() -> None:
    rows = [*TABLE, _row("s1", "S", 10.3, 10.0, gpus=1), _row("s2", "S", 9.0, 10.0, gpus=1)]
    m = fit(rows, multi=False)           # needs 0.03 and 0: the larger, k = n = 2
    assert m["margin"] == pytest.approx(0.03) and m["n"] == 2 and m["kind"] == "single-gpu margin"
    assert m["held_out"]["n"] == 0 and m["held_out"]["per_source"] == []
    assert fit(rows)["n"] == 4          # the multi-GPU fit never sees them


@pytest.mark.parametrize("name, multi", [("multi-gpu.json", True), ("single-gpu.json", False)])
def test_the_shipped_margins_are_what_todays_rows_fit(name: str, multi: bool) -> None:
    # an estimator change moves the published rows' errors; the shipped margin must be refitted with them
    # (`hpcmem validate published --fit-margin`), not left at what older estimates needed
    shipped = json.loads(resources.files("hpcmem").joinpath(f"calibrations/{name}").read_text())
    fresh = fit([score(r) for r in load().rows if r.scored], multi=multi)
    assert shipped["margin"] == pytest.approx(fresh["margin"], abs=5e-4), (shipped["margin"], fresh["margin"])
    assert shipped["evidence"]["rows"] == fresh["evidence"]["rows"]
    assert [s["margin"] for s in shipped["held_out"]["per_source"]] == pytest.approx(
        [s["margin"] for s in fresh["held_out"]["per_source"]], abs=5e-4)

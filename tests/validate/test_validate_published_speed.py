"""Published training speeds (fast tier, no torch): the shipped rows load, are cited and build as jobs; the scores
(ratio error, Kendall's tau, the scale held out by source) match hand calculations on small lists; `hpcmem validate
--against published --speed` prints the table; a malformed file is refused in one line naming the field."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from hpcmem.cli import cli
from hpcmem.validate.published import PublishedError
from hpcmem.validate.published_speed import load, read_file
from hpcmem.validate.published_speed_score import ScoredSpeed, fitted_scale, hold_out, ratio_error, score, stats


@pytest.fixture(scope="module")
def rows():
    return load()[0]


def _point(i: int, source: str, predicted: float, measured: float) -> ScoredSpeed:
    return ScoredSpeed(id=f"r{i}", source=source, gpu="X", gpus=1, technique="full", measured=measured,
                       predicted=predicted)


def test_the_shipped_table_is_cited_and_large_enough(rows):
    scored = [r for r in rows if r.scored]
    assert len(scored) >= 20
    assert len({r.source for r in scored}) >= 3
    for r in rows:
        assert r.citation and r.where, r.id                   # the source and the place in it
        assert r.tokens_per_s > 0
    assert all(r.reason for r in rows if not r.scored)


def test_every_scored_row_gets_a_prediction(rows):
    points = [score(r) for r in rows if r.scored]
    assert [p.id for p in points if p.predicted is None] == []


def test_a_run_time_becomes_tokens_per_second_per_gpu(rows):
    # the source's own check: Mistral 7B on 2x 4090, 1024 rows of 2048 tokens in 483 s, "2,200 tokens/second":
    # 1024 x 2048 / (483 x 2) = 2,097,152 / 966 = 2170.96
    row = next(r for r in rows if r.id == "aais-4090-mistral-qlora-offload-b12-c2048")
    assert row.tokens_per_s == pytest.approx(2170.96, abs=0.01)


def test_ratio_error_is_symmetric_in_the_factor():
    assert ratio_error(1.25) == pytest.approx(1.25)
    assert ratio_error(0.8) == pytest.approx(1.25)
    assert ratio_error(1.0) == 1.0


def test_kendall_tau_on_a_hand_worked_list():
    # predicted 1 2 3 4 vs measured 1 3 2 4: of the 6 pairs only (2nd, 3rd) is discordant: (5 - 1) / 6 = 0.667
    pts = [_point(i, "a", p, m) for i, (p, m) in enumerate([(1, 1), (2, 3), (3, 2), (4, 4)])]
    st = stats(pts)
    assert st["kendall_tau"] == pytest.approx(0.667, abs=1e-3)
    # ratios 1, 2/3, 3/2, 1: errors 1, 1.5, 1.5, 1 -> median 1.25, worst 1.5; geomean ratio 1
    assert st["median_ratio_error"] == pytest.approx(1.25)
    assert st["worst_ratio_error"] == pytest.approx(1.5)
    assert st["geomean_ratio"] == pytest.approx(1.0)
    # pairs of ratios: (1, 2/3) 1.5, (1, 3/2) 1.5, (1, 1) 1, (2/3, 3/2) 2.25, (2/3, 1) 1.5, (3/2, 1) 1.5 -> median 1.5
    assert st["median_pair_ratio_error"] == pytest.approx(1.5)


def test_the_scale_is_held_out_by_source():
    # measured / predicted: source a 2, b 8, c 4. The scale for a is fitted on b and c: sqrt(8 x 4) = 5.657
    pts = [_point(0, "a", 1, 2), _point(1, "b", 1, 8), _point(2, "c", 1, 4)]
    assert fitted_scale(pts) == pytest.approx(4.0)                 # (2 x 8 x 4) ** (1/3)
    scales = hold_out(pts)
    assert scales["a"] == pytest.approx(math.sqrt(32))
    assert scales["b"] == pytest.approx(math.sqrt(8))
    assert pts[0].held_out_predicted == pytest.approx(5.657, abs=0.001)
    assert pts[0].held_out_ratio == pytest.approx(5.657 / 2, abs=0.001)


def test_the_command_prints_the_table_with_tau_and_ratio_errors():
    res = CliRunner().invoke(cli, ["validate", "--against", "published", "--speed", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert len(out["rows"]) >= 20
    assert out["summary"]["overall"]["kendall_tau"] is not None
    assert len(out["summary"]["per_source"]) >= 3
    assert all(r["held_out_ratio"] is not None for r in out["rows"])


def test_a_run_time_without_its_rows_is_refused(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("source: {id: x, citation: {url: 'https://example.org'}, loop: other, loop_name: x, "
                    "unit: s/run}\ndefaults: {gpu: H100-80GB, settings: {max_length: 512}}\n"
                    "rows: [{id: a, where: t, measured: 10}]\n")
    with pytest.raises(PublishedError, match="run_rows"):
        read_file(path)


def test_an_unscored_row_needs_a_reason(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("source: {id: x, citation: {url: 'https://example.org'}, loop: other, loop_name: x, "
                    "unit: tokens/s/GPU}\ndefaults: {gpu: H100-80GB}\n"
                    "rows: [{id: a, where: t, measured: 10, scored: false}]\n")
    with pytest.raises(PublishedError, match=r"row 1 \(a\).*reason"):
        read_file(path)

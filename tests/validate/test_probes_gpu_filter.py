"""`hpcmem validate probes --gpu NAME`: a records file is named by its device's slug (nvidia-h200.jsonl); the catalog
name and its aliases select it too, and a GPU without records says so."""

from __future__ import annotations

from click.testing import CliRunner

from hpcmem.cli import cli
from hpcmem.datapath import estimator_dir
from hpcmem.validate.probes import load
from tests.helpers.cli_main import run_main

PROBES = estimator_dir() / "probes"


def test_catalog_names_and_the_device_slug_select_the_same_records():
    by_slug = {r.id for r in load([PROBES], gpu="nvidia-h200", estimate=False).records}
    assert len(by_slug) >= 40
    for name in ("H200", "h200", "H200-SXM"):
        assert {r.id for r in load([PROBES], gpu=name, estimate=False).records} == by_slug
    assert not load([PROBES], gpu="H100-80GB", estimate=False).records
    assert {r.device for r in load([PROBES], gpu="cpu", estimate=False).records} == {"cpu"}


def test_a_gpu_without_records_is_named():
    out = CliRunner().invoke(cli, ["validate", "probes", "--gpu", "L40S", "--no-png"])
    assert out.exit_code == 0, out.output
    assert "no records of GPU 'L40S'" in out.output


def _probes(*args: str):
    return CliRunner().invoke(cli, ["validate", "probes", "--no-png", *args])


def test_a_selection_that_names_nothing_is_refused_in_one_line(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    for args, said in ((["--gpu", ""], "--gpu ''"), (["--gpu", "bogus"], "neither a catalog GPU"),
                       (["--records", str(empty)], "a folder without a .jsonl records file"),
                       (["--fit", "--fit-dir", ""], "--fit-dir ''"), (["--fit", "--fit-dir", "a\nb"], "control")):
        code, out, err = run_main(["validate", "probes", "--no-png", *args], capsys)
        assert code == 2 and not out and said in err and err.count("\n") == 1, (args, err)


def test_an_unwritable_calibration_folder_is_one_line(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, _, err = run_main(["validate", "probes", "--no-png", "--gpu", "H200", "--score-since-fit", "--fit-dir",
                             str(blocker / "sub")], capsys)
    assert code == 2 and "cannot write h200.json" in err and err.count("\n") == 1, err


def test_score_since_fit_updates_the_calibration_in_the_folder_it_writes_to(tmp_path):
    """A folder that holds its own H200 calibration (fitted later than the shipped one) gets its own tally: its
    margins and fit date stay, the shipped file is not copied over it."""
    import json

    from hpcmem.gpus.calibration import load_calibration

    shipped = load_calibration("H200")
    shipped.pop("_path")
    own = {**shipped, "provenance": {**shipped["provenance"], "fitted_at": "2026-12-04T16:00:00+00:00"},
           "margins": {**shipped["margins"], "device": {**shipped["margins"]["device"], "margin": 0.05}}}
    own.pop("since_fit", None)
    (tmp_path / "h200.json").write_text(json.dumps(own))
    out = _probes("--gpu", "H200", "--score-since-fit", "--fit-dir", str(tmp_path))
    assert out.exit_code == 0, out.output
    written = json.loads((tmp_path / "h200.json").read_text())
    assert written["margins"]["device"]["margin"] == 0.05
    assert written["since_fit"]["device"]["after"] == "2026-12-04T16:00:00+00:00"
    # only the runs after 16:00 on 2026-12-04 (the third lease's), fewer than after the shipped fit
    assert 0 < written["since_fit"]["device"]["n"] < shipped["since_fit"]["device"]["n"]


def test_a_record_is_labelled_by_the_gpu_it_ran_on_not_by_its_file(tmp_path):
    """An H200 record copied into a file named for another GPU stays an H200 run: selected by --gpu H200, not by the
    file's GPU, grouped under nvidia-h200, and a note names the mismatch."""
    import json

    line = next(x for x in (PROBES / "nvidia-h200.jsonl").read_text().splitlines()
                if (json.loads(x).get("gpu") or {}).get("gpu_name") == "NVIDIA H200"
                and json.loads(x).get("status") == "ok")
    (tmp_path / "nvidia-a100-sxm4-80gb.jsonl").write_text(line + "\n")
    as_h200 = load([tmp_path], gpu="H200", estimate=False)
    assert len(as_h200.records) == 1 and set(as_h200.by_gpu) == {"nvidia-h200"}
    assert any("is stored in nvidia-a100-sxm4-80gb.jsonl: scored as nvidia-h200" in n for n in as_h200.notes)
    assert not load([tmp_path], gpu="A100-80GB", estimate=False).records
    # the shipped files hold their own GPU's records: no such note
    assert not any("is stored in" in n for n in load([PROBES], estimate=False).notes)

"""`hpcmem validate` as one subcommand per instrument; the earlier `--against MODE` form is read as the same command."""

from __future__ import annotations

import io
import json
import shutil
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from hpcmem.cli import run
from hpcmem.cli.validate import against_as_subcommand

ESTIMATOR = Path(__file__).resolve().parents[2] / "estimator"


@pytest.mark.parametrize("given,read", [
    (["--against", "trace", "--rescore"], ["trace", "--rescore"]),
    (["--json", "--against=coverage", "--types", "llama"], ["coverage", "--json", "--types", "llama"]),
    (["--stored", "--no-png"], ["probes", "--stored", "--no-png"]),      # no mode: probes, as before
    (["boundary", "--json"], ["boundary", "--json"]),
    (["--help"], ["--help"]),
    ([], []),
    (["--records", "x", "--", "--against", "trace"], ["probes", "--records", "x", "--", "--against", "trace"]),
])
def test_the_earlier_form_is_read_as_a_subcommand(given, read):
    assert against_as_subcommand(given) == read


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        status = run(argv)
    return status, out.getvalue(), err.getvalue()


def test_both_forms_rescore_the_stored_traces_alike(tmp_path, monkeypatch):
    """The stored trace records, re-estimated (in a copy of estimator/: rescoring rewrites the records and the
    report): the subcommand and the --against form print the same table."""
    for part in ("cases", "traces"):
        shutil.copytree(ESTIMATOR / part, tmp_path / part)
    monkeypatch.setenv("HPCMEM_ESTIMATOR_DIR", str(tmp_path))
    new = _run(["validate", "trace", "--rescore", "--json"])
    old = _run(["validate", "--against", "trace", "--rescore", "--json"])
    assert new[0] == old[0] == 0, new[2] + old[2]
    assert json.loads(new[1])["cells"] and new[1] == old[1]


@pytest.mark.parametrize("argv,words", [
    (["validate", "probes", "--ci"], ("--ci", "`validate trace`", "`validate probes`")),
    (["validate", "trace", "--fit"], ("--fit", "`validate probes`", "`validate trace`")),
    (["validate", "coverage", "--records", "x"], ("--records", "`validate probes` and `validate boundary`")),
    (["validate", "--against", "nope"], ("'nope'", "probes, trace, boundary, coverage")),
    (["validate", "trace", "--relearn"], ("--relearn", "`validate coverage`")),
    (["validate", "coverage", "--short-checks"], ("--short-checks", "--relearn")),
    (["validate", "coverage", "--relearn"], ("--relearn", "--types")),
    (["validate", "coverage", "--relearn", "--types", "smollm3,llama"], ("--types llama", "not a learned type")),
    (["validate", "coverage", "--add-missing"], ("--add-missing", "--types")),
    (["validate", "coverage", "--add-missing", "--relearn", "--types", "gpt2"], ("--add-missing", "--relearn")),
    (["validate", "coverage", "--add-missing", "--types", "gpt2,llama"], ("--types llama", "not a learned type")),
    (["validate", "coverage", "--cells", "full-noamp"], ("--cells", "--add-missing")),
    (["validate", "coverage", "--add-missing", "--types", "gpt2", "--cells", "full-noamp,bogus"],
     ("--cells", "bogus", "lora-noamp")),
    (["validate", "coverage", "--add-missing", "--types", "gpt2", "--cells", " , "], ("--cells", "empty")),
    (["validate", "coverage", "--hold-longer", "65536"], ("--hold-longer", "--types")),
    (["validate", "coverage", "--hold-longer", "65536", "--add-missing", "--types", "gpt2"],
     ("--hold-longer", "--add-missing")),
    (["validate", "coverage", "--hold-longer", "65536,6x", "--types", "gpt2"], ("--hold-longer", "'6x'", "integer")),
    (["validate", "coverage", "--hold-longer", "0", "--types", "gpt2"], ("--hold-longer", "got 0")),
    (["validate", "coverage", "--hold-longer", "65536", "--types", "gpt2,llama"], ("--types llama",
                                                                                   "not a learned type")),
])
def test_a_flag_or_mode_of_no_instrument_here_is_one_line_naming_the_right_one(argv, words):
    status, out, err = _run(argv)
    assert status == 2 and not out and err.count("\n") == 1 and err.startswith("hpcmem: error: "), err
    for word in words:
        assert word in err, err


@pytest.mark.parametrize("argv,words", [
    (["validate", "trace", "--only", "no-such-case"], ("--only", "no-such-case")),
    (["validate", "trace", "--only", " , "], ("--only", "case ids")),
    (["validate", "trace", "--only", "qwen15moe-lora-2k", "--rescore"], ("--only", "--rescore")),
])
def test_trace_only_refuses_in_one_line_before_anything_runs(argv, words, tmp_path, monkeypatch):
    for part in ("cases", "traces"):
        shutil.copytree(ESTIMATOR / part, tmp_path / part)
    monkeypatch.setenv("HPCMEM_ESTIMATOR_DIR", str(tmp_path))
    before = {p.name: p.read_bytes() for p in (tmp_path / "traces").iterdir()}
    status, out, err = _run(argv)
    assert status != 0 and not out and err.count("\n") == 1 and err.startswith("hpcmem: error: "), err
    for word in words:
        assert word in err, err
    assert {p.name: p.read_bytes() for p in (tmp_path / "traces").iterdir()} == before
    assert not (tmp_path / "ACCURACY-trace.md").exists()

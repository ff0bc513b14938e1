"""A learned profile under the user's or the site's folders is checked before it is used: a malformed one (a list
for a mapping, text for a count, NaN, a short row, absurd coefficients, a file far larger than any profile) is refused
in one line naming the file and the place — never an internal error, never a few-MiB peak that "fits"."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from hpcmem.cli import run

SHIPPED = next((Path(__file__).resolve().parents[2] / "hpcmem" / "profiles").glob("gpt_oss-37f8*.json"))
BASE = json.loads(SHIPPED.read_text())
CELL = sorted(BASE["cells"])[0]


def _bad(doc, path, value):
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return doc


CASES = {
    "list for a mapping": (["model"], [1, 2], "model must be a mapping"),
    "text for a count": (["model", "hidden_size"], "2880", "model.hidden_size must be an integer"),
    "NaN coefficient": (["cells", CELL, "kept", 0], [float("nan"), 0.0, 0.0], "must be a finite number"),
    "short row": (["kinds", 0, "linears", 0], ["q_proj", 1, 2], "[name, in, out, count"),
    "absurd coefficients": (["cells", CELL, "peak", 0], [-1e12, -1e12, -1e12], "magnitude"),
    "huge negative count": (["model", "embed"], -3999998681856, "model.embed must be an integer in 0.."),
    "more idle than held": (["kinds", 0, "idle"], BASE["kinds"][0]["params"] + 1, "kinds[0].idle must be an integer"),
    "idle linears not names": (["kinds", 0, "idle_linears"], [3], "kinds[0].idle_linears must be linear names"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_malformed_user_profile_is_refused_in_one_line(case, tmp_path, monkeypatch, capsys):
    path, value, words = CASES[case]
    doc = _bad(copy.deepcopy(BASE), path, value)
    folder = tmp_path / "profiles"
    folder.mkdir()
    (folder / SHIPPED.name).write_text(json.dumps(doc))       # same name: the user's folder is searched first
    monkeypatch.setenv("HPCMEM_DATA", str(tmp_path))
    capsys.readouterr()
    assert run(["estimate", "sft", "--model_name_or_path", "openai/gpt-oss-20b", "--gpu", "H200"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and str(folder / SHIPPED.name) in err and words in err, err


def test_a_profile_file_far_larger_than_any_profile_is_not_read(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "profiles"
    folder.mkdir()
    with open(folder / SHIPPED.name, "wb") as fh:          # sparse: 2 GiB on paper, nothing on disk
        fh.truncate(2 * 2**30)
    monkeypatch.setenv("HPCMEM_DATA", str(tmp_path))
    assert run(["estimate", "sft", "--model_name_or_path", "openai/gpt-oss-20b"]) == 2
    assert "MiB" in capsys.readouterr().err


def test_every_shipped_profile_passes_the_check():
    from hpcmem.models.profile_check import check_profile_doc

    for path in (Path(__file__).resolve().parents[2] / "hpcmem" / "profiles").glob("*.json"):
        check_profile_doc(json.loads(path.read_text()), str(path))

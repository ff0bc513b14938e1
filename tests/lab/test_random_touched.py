"""`python -m hpcmem.lab.random_touched` (the jobs of a fresh seed a change touches): bad input is refused in one line
naming the flag, never a traceback; a stored touched-jobs file scores as the rows it holds."""

from __future__ import annotations

import pytest

from hpcmem.datapath import estimator_dir
from hpcmem.lab.random_touched import main


@pytest.mark.parametrize(("argv", "files", "said"), [
    (["default-nodrop", "--upto", "-3"], {}, "--upto -3: at least 1 job"),
    (["default-nodrop", "--score", "{d}/none.jsonl"], {}, "no such records file"),
    (["default-nodrop", "--score", "{d}/bad.jsonl"], {"bad.jsonl": b"\xff\xfe\n"}, "--score"),
    (["default-nodrop", "--score", "{d}/noid.jsonl"], {"noid.jsonl": b'{"id": 1}\n'}, "is no record"),
    (["default-nodrop", "--score", "{d}/nojob.jsonl"], {"nojob.jsonl": b'{"id": "x"}\n'}, "record 'x' holds no job"),
])
def test_bad_input_is_one_line(tmp_path, capsys, argv, files, said) -> None:
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    with pytest.raises(SystemExit) as out:
        main([a.format(d=tmp_path) for a in argv])
    assert out.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert said in err[-1] and "Traceback" not in "\n".join(err)


@pytest.mark.torch
def test_scores_a_stored_touched_file(capsys) -> None:
    path = estimator_dir() / "random" / "touched" / "default-nodrop-reentrant.jsonl"
    assert main(["default-nodrop-reentrant", "--score", str(path)]) == 0
    out = capsys.readouterr()
    rows = [line for line in out.out.splitlines() if line.startswith("{")]
    assert len(rows) == len(path.read_text().splitlines())
    assert "scored" in out.err.strip().splitlines()[-1]

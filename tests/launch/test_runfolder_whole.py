"""A run folder is written whole or not at all: a write that fails half-way (a value that is not UTF-8 text, a
file that cannot be made) leaves nothing behind, and an existing folder is never written into."""

from __future__ import annotations

import pytest

from hpcmem.errors import HpcmemError
from hpcmem.launch import runfolder


def test_a_failing_write_leaves_no_half_written_run_folder(tmp_path):
    with pytest.raises(HpcmemError, match="nothing was left behind"):
        runfolder.write(tmp_path / "run", {"accelerate.yaml": "ok\n", "trl.yaml": "dataset_name: caf\udce9\n"})
    assert list(tmp_path.iterdir()) == []


def test_a_run_folder_is_complete_and_an_existing_one_is_never_written_into(tmp_path):
    runfolder.write(tmp_path / "run", {"trl.yaml": "a: 1\n", runfolder.SCRIPT: "#!/bin/bash\n"})
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["job.sbatch", "logs", "trl.yaml"]
    assert (tmp_path / "run" / runfolder.SCRIPT).stat().st_mode & 0o111
    (tmp_path / "empty").mkdir()
    for name in ("run", "empty"):
        with pytest.raises(HpcmemError, match="already exists"):
            runfolder.write(tmp_path / name, {"trl.yaml": "b: 2\n"})
    assert (tmp_path / "run" / "trl.yaml").read_text() == "a: 1\n" and list((tmp_path / "empty").iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "run"]

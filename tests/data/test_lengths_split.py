"""--split selects a split of a DatasetDict (a save_to_disk folder of one, or a cached dataset); a data file or a
saved single Dataset holds one split, so another --split is refused instead of profiling rows nobody asked for.
The splits are the real `datasets` package's (what load_dataset names a file's split, what save_to_disk keeps)."""

from __future__ import annotations

import json

import pytest

from hpcmem.data.errors import DataNotFound
from hpcmem.data.load import load_data

datasets = pytest.importorskip("datasets")


def test_a_data_file_is_one_split_and_another_split_is_refused(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"text": f"row {i}"}) + "\n" for i in range(3)))
    assert list(datasets.load_dataset("json", data_files=str(path), cache_dir=str(tmp_path / "c"))) == ["train"]
    assert len(load_data(str(path), cache_dir=str(tmp_path / "c"))) == 3
    with pytest.raises(DataNotFound, match="holds one split; --split 'test'"):
        load_data(str(path), split="test", cache_dir=str(tmp_path / "c"))


def test_a_saved_dataset_refuses_a_split_and_a_saved_dict_selects_it(tmp_path):
    rows = datasets.Dataset.from_dict({"text": ["a", "b"]})
    rows.save_to_disk(str(tmp_path / "one"))
    with pytest.raises(DataNotFound, match="holds one split"):
        load_data(str(tmp_path / "one"), split="test")
    datasets.DatasetDict({"train": rows, "test": rows.select([0])}).save_to_disk(str(tmp_path / "dict"))
    assert len(load_data(str(tmp_path / "dict"), split="test")) == 1

"""Open the user's dataset and tokenizer, offline. datasets/transformers are imported inside the functions."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from hpcmem.data.errors import DataNotFound, EmptyDataset, TokenizerNotFound, UnknownFormat

# file extension → the `datasets` builder that reads it
FILE_FORMATS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}


def describe_formats() -> str:
    return (", ".join(FILE_FORMATS) + " files, a folder written by Dataset.save_to_disk, a folder of such files, or a "
            "dataset name in the local cache")


@contextlib.contextmanager
def _offline() -> Iterator[None]:
    """Never reach the Hub: datasets and huggingface_hub read these flags at import, so set them for the call."""
    import datasets.config
    import huggingface_hub.constants as hub

    saved = datasets.config.HF_HUB_OFFLINE, hub.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = hub.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, hub.HF_HUB_OFFLINE = saved


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """datasets' builders log a parse failure at ERROR before raising it (packaged_modules/json/json.py
    `_generate_tables`: "Failed to load JSON from file …"); the exception says the same and hpcmem reports it in its
    own line, so the library's logger stays below that while the data loads."""
    import datasets

    level = datasets.logging.get_verbosity()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)
    try:
        yield
    finally:
        datasets.logging.set_verbosity(level)


def _reason(exc: BaseException) -> str:
    """The innermost explicit cause of a builder's exception (datasets raises "An error occurred while generating the
    dataset" from the parser's error), on one line."""
    seen = {id(exc)}
    while (inner := exc.__cause__) is not None and id(inner) not in seen:
        seen.add(id(inner))
        exc = inner
    return " ".join(f"{type(exc).__name__}: {exc}".split())


def load_data(data: str, *, split: str = "train", cache_dir: str | None = None):
    """DATA → one `datasets.Dataset` (the split): a .jsonl/.json/.csv/.parquet file, a save_to_disk folder, a folder
    of data files, or a dataset name in the local cache."""
    with _quiet():
        return _load_data(data, split, cache_dir)


def _load_data(data: str, split: str, cache_dir: str | None):
    import datasets

    path = Path(data)
    if path.is_dir() and ((path / "state.json").exists() or (path / "dataset_dict.json").exists()):
        loaded = datasets.load_from_disk(str(path))
        if not isinstance(loaded, datasets.DatasetDict):
            _one_split(data, split)
    elif path.is_file():
        _one_split(data, split)
        loaded = _load_file(path, cache_dir)
    elif not path.is_dir() and (path.is_absolute() or data.startswith((".", "~"))):
        raise DataNotFound(f"{data}: no such file or folder; expected {describe_formats()}")
    else:  # a folder of data files, or a name: datasets resolves both, offline
        try:
            with _offline():
                loaded = datasets.load_dataset(data, split=split, cache_dir=cache_dir)
        except Exception as exc:
            what = "no readable data files in that folder" if path.is_dir() else \
                "no such file, and no dataset of that name in the local cache"
            raise DataNotFound(f"{data}: {what} (split {split!r}; {exc.__class__.__name__}: {exc}); download it "
                               "first or pass a file") from exc
    return _pick_split(loaded, split, data)


def _one_split(data: str, split: str) -> None:
    """A data file or a saved single Dataset is one split (datasets names a file's `train`): another --split would
    select nothing, and the profile would describe rows the user did not ask for."""
    if split != "train":
        raise DataNotFound(f"{data} holds one split; --split {split!r} selects splits of a DatasetDict folder or a "
                           "cached dataset only — leave it out")


def _load_file(path: Path, cache_dir: str | None):
    import datasets

    builder = FILE_FORMATS.get(path.suffix.lower())
    if builder is None:
        raise UnknownFormat(f"{path}: unknown format {path.suffix or '(no extension)'!r}; "
                            f"hpcmem lengths reads {describe_formats()}")
    if path.stat().st_size == 0:
        raise EmptyDataset(f"{path}: the file is empty")
    try:
        return datasets.load_dataset(builder, data_files=str(path), split="train", cache_dir=cache_dir)
    except Exception as exc:  # the builders raise many kinds; all mean the file does not parse
        if "corresponds to no data" in str(exc):   # datasets' words for a file with a header and no rows
            raise EmptyDataset(f"{path}: the file has no rows") from exc
        raise UnknownFormat(f"{path}: not readable as {builder}: {_reason(exc)}") from exc


def _pick_split(loaded, split: str, data: str):
    import datasets

    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise DataNotFound(f"{data}: no split {split!r}; it has {', '.join(loaded)} — pass --split")
        loaded = loaded[split]
    if len(loaded) == 0:
        raise EmptyDataset(f"{data}: the dataset (split {split!r}) has no rows")
    return loaded


def load_tokenizer(name_or_path: str):
    """A local tokenizer folder or a cached Hub name; `local_files_only` keeps it offline."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name_or_path, local_files_only=True)
    except Exception as exc:  # OSError, ValueError, … : all mean there is no usable tokenizer there
        raise TokenizerNotFound(f"tokenizer {name_or_path!r} not found locally ({exc.__class__.__name__}: "
                                f"{str(exc).splitlines()[0] if str(exc) else ''}); pass a folder holding "
                                "tokenizer.json / tokenizer_config.json, or a Hub name already in the local "
                                "cache") from exc

"""Paths a command writes a picture or a snapshot to (--plot, --png, --timeline, --snapshot): a file with the format's
suffix, checked when the flag is read, before any work — so a config or a folder given there by mistake is refused,
never overwritten."""

from __future__ import annotations

from pathlib import Path

import click


class SuffixPath(click.Path):
    """A file path ending in one of `suffixes` (matplotlib picks the picture's format from it; every picture hpcmem
    draws is a PNG, every snapshot a pickle)."""

    def __init__(self, suffixes: tuple[str, ...], what: str) -> None:
        super().__init__(dir_okay=False)
        self.suffixes, self.what = suffixes, what
        self.name = suffixes[0].lstrip(".")

    def convert(self, value, param, ctx):
        path = super().convert(value, param, ctx)
        if Path(str(path)).suffix.lower() not in self.suffixes:
            self.fail(f"{click.format_filename(str(path))!r} must end in {' or '.join(self.suffixes)}: it is written "
                      f"as {self.what} (nothing else is overwritten)", param, ctx)
        return path


PNG = SuffixPath((".png",), "a PNG")
PICKLE = SuffixPath((".pickle", ".pkl"), "a pickle")


class RecordsOut(click.Path):
    """A records file a command appends one JSON line to (probe --out): `.jsonl`, in a folder, and — when it exists
    already — a regular file whose every line is a record (hpcmem.record.read_records); anything else is the user's
    and is kept."""

    def __init__(self) -> None:
        super().__init__(dir_okay=False)
        self.name = "jsonl"

    def convert(self, value, param, ctx):
        from hpcmem.record import RecordError, read_records

        path = Path(str(super().convert(value, param, ctx)))
        shown = click.format_filename(str(path))
        if path.suffix.lower() != ".jsonl":
            self.fail(f"{shown!r} must end in .jsonl: a record is appended to it as one JSON line (nothing else is "
                      "written to)", param, ctx)
        if path.parent.exists() and not path.parent.is_dir():
            self.fail(f"{shown!r}: {path.parent} is not a folder", param, ctx)
        if path.exists() or path.is_symlink():
            if not path.is_file():
                self.fail(f"{shown!r} exists and is not a regular file; choose another file", param, ctx)
            try:
                read_records(path)
            except RecordError as exc:
                self.fail(f"{shown!r} exists and is not a records file ({exc.problems[0]}); it is kept: choose "
                          "another file", param, ctx)
        return str(path)


RECORDS = RecordsOut()

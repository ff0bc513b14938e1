"""Paths a command writes to — a picture or a snapshot (--plot, --png, --timeline, --snapshot: a file with the
format's suffix), probe records (--out), a length profile (--save) — checked when the flag is read, before any work,
so a config or a folder given there by mistake is refused, never overwritten."""

from __future__ import annotations

from pathlib import Path

import click

from hpcmem.errors import HpcmemError
from hpcmem.inputs.files import is_file, load_json_file
from hpcmem.plots.mpl import MARK


class KeptFile(click.Path):
    """A file a command writes or appends to, checked before any work: its folder must be a folder, a symbolic link
    is never written through, and a file there already is used only when `foreign` finds it is hpcmem's own kind;
    anything else is the user's and is kept."""

    def __init__(self, name: str, path_type: type | None = None) -> None:
        super().__init__(dir_okay=False, path_type=path_type)
        self.name = name

    def named(self, path: Path, shown: str) -> str | None:
        """Why the name itself is refused (the whole message), or None."""
        return None

    def foreign(self, path: Path, shown: str) -> str | None:
        """Why the existing `path` is not one to write to (the whole message), or None."""
        raise NotImplementedError

    def convert(self, value, param, ctx):
        converted = super().convert(value, param, ctx)
        path = Path(str(converted))
        shown = click.format_filename(str(path))
        why = self.named(path, shown)
        if why is None and path.parent.exists() and not path.parent.is_dir():
            why = f"{shown!r}: {path.parent} is not a folder"
        if why is None and path.is_symlink():
            why = f"{shown!r} is a symbolic link; hpcmem never writes through one (it is kept): choose another file"
        if why is None and path.exists():
            why = self.foreign(path, shown)
        if why is not None:
            self.fail(why, param, ctx)
        return converted


class RecordsOut(KeptFile):
    """A records file a command appends one JSON line to (probe --out): `.jsonl`, in a folder, and — when it exists
    already — a regular file whose every line is a record (hpcmem.record.read_records)."""

    def __init__(self) -> None:
        super().__init__("jsonl")

    def named(self, path: Path, shown: str) -> str | None:
        if path.suffix.lower() != ".jsonl":
            return (f"{shown!r} must end in .jsonl: a record is appended to it as one JSON line (nothing else is "
                    "written to)")
        return None

    def foreign(self, path: Path, shown: str) -> str | None:
        from hpcmem.record import RecordError, read_records  # deferred: ~10 ms every command pays; only probe --out

        if not path.is_file():
            return f"{shown!r} exists and is not a regular file; choose another file"
        try:
            read_records(path)
        except RecordError as exc:
            return f"{shown!r} exists and is not a records file ({exc.problems[0]}); it is kept: choose another file"
        return None


class ProfileOut(KeptFile):
    """`hpcmem lengths --save`: a file already there is replaced only when it is a length profile itself."""

    def __init__(self) -> None:
        super().__init__("file", path_type=Path)

    def foreign(self, path: Path, shown: str) -> str | None:
        from hpcmem.data.profile import SCHEMAS  # deferred: the profile module costs every command; lengths --save

        try:        # within hpcmem.inputs.files' limits: a FIFO or a device there is not read (it could block)
            schema = load_json_file(path, "length profile").get("schema") if is_file(path) else None
        except (HpcmemError, AttributeError):
            schema = None
        if schema not in SCHEMAS:
            return (f"{shown!r} exists and is not a length profile ({' or '.join(SCHEMAS)}); it is kept: choose "
                    "another file")
        return None


class SuffixPath(KeptFile):
    """A file path ending in one of `suffixes` (matplotlib picks the picture's format from it; every picture hpcmem
    draws is a PNG, every snapshot a pickle). A file already there is replaced only when hpcmem drew it (a PNG whose
    Software text is hpcmem's, hpcmem.plots.mpl.MARK); a snapshot never replaces a file."""

    def __init__(self, suffixes: tuple[str, ...], what: str) -> None:
        super().__init__(suffixes[0].lstrip("."))
        self.suffixes, self.what = suffixes, what

    def named(self, path: Path, shown: str) -> str | None:
        if path.suffix.lower() not in self.suffixes:
            return (f"{shown!r} must end in {' or '.join(self.suffixes)}: it is written as {self.what} (nothing else "
                    "is overwritten)")
        return None

    def foreign(self, path: Path, shown: str) -> str | None:
        if self.suffixes == (".png",) and drawn_by_hpcmem(path):
            return None
        return (f"{shown!r} exists and is not {self.what} hpcmem wrote; it is kept: choose another file (or remove "
                "it first)")


def drawn_by_hpcmem(path: Path) -> bool:
    """A regular PNG file whose first chunks carry hpcmem's Software text (hpcmem.plots.mpl.save writes it)."""
    if not is_file(path) or path.is_symlink():
        return False
    try:
        with open(path, "rb") as fh:
            head = fh.read(4096)
    except OSError:
        return False
    return head.startswith(b"\x89PNG\r\n\x1a\n") and PNG_MARK in head


PNG_MARK = b"tEXtSoftware\x00" + MARK.encode()
PNG = SuffixPath((".png",), "a PNG")
PICKLE = SuffixPath((".pickle", ".pkl"), "a pickle")
RECORDS = RecordsOut()
PROFILE = ProfileOut()

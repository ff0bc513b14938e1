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

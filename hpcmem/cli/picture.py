"""The path a picture option (--plot, --png, --timeline) writes: a PNG file, checked when the flag is read, before any
work — so a config or a folder given there by mistake is refused, never overwritten."""

from __future__ import annotations

from pathlib import Path

import click


class PngPath(click.Path):
    """A file path ending in .png (matplotlib picks the format from the suffix; every picture hpcmem draws is a PNG)."""

    name = "png"

    def __init__(self) -> None:
        super().__init__(dir_okay=False)

    def convert(self, value, param, ctx):
        path = super().convert(value, param, ctx)
        if Path(str(path)).suffix.lower() != ".png":
            self.fail(f"{click.format_filename(str(path))!r} must end in .png: the picture is written as a PNG "
                      "(nothing else is overwritten)", param, ctx)
        return path


PNG = PngPath()

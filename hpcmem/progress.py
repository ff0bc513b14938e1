"""Progress of long work (trace matrices, validation, length profiles, calibration): one line on stderr.

On a terminal a bar redrawn in place; piped or redirected, plain lines (each item with a detail, otherwise about every
tenth of the work), so logs stay readable; nothing at all when the command prints `--json` or is told to be quiet.
Stdout is never touched, so `--json` output and tables stay clean. Stdlib only (the light core uses it).
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

BAR_WIDTH = 24


class Progress:
    """`with Progress(n, "tracing") as bar: … bar.advance(detail="case x: +0.1 %")`."""

    def __init__(self, total: int, label: str, *, enabled: bool = True, stream: TextIO | None = None,
                 interactive: bool | None = None) -> None:
        self.total = max(int(total), 0)
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled and self.total > 0
        self.interactive = _isatty(self.stream) if interactive is None else interactive
        self.done = 0
        self._start = time.monotonic()
        self._last_tenth = 0
        self._open_line = False

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def advance(self, step: int = 1, detail: str = "") -> None:
        self.done = min(self.done + step, self.total)
        if not self.enabled:
            return
        if self.interactive:
            self._draw(detail)
            return
        tenth = (10 * self.done) // self.total
        if detail or tenth > self._last_tenth or self.done == self.total:
            self._last_tenth = tenth
            self._write(f"{self.label}: [{self.done}/{self.total}]" + (f" {detail}" if detail else "") + "\n")

    def note(self, text: str) -> None:
        """A line that must stay visible (a failure), printed above the bar."""
        if not self.enabled:
            return
        if self._open_line:
            self._write("\n")
            self._open_line = False
        self._write(f"{self.label}: {text}\n")

    def close(self) -> None:
        if self.enabled and self.interactive and self._open_line:
            self._write("\n")
            self._open_line = False

    def _draw(self, detail: str) -> None:
        filled = (BAR_WIDTH * self.done) // self.total
        elapsed = time.monotonic() - self._start
        eta = elapsed / self.done * (self.total - self.done) if self.done else 0.0
        text = (f"\r{self.label} [{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {self.done}/{self.total} "
                f"{elapsed:5.0f} s, ~{eta:.0f} s left" + (f"  {detail}" if detail else ""))
        self._write(text[:200] + "\033[K")
        self._open_line = True

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):     # a closed pipe must not end the work
            self.enabled = False


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False

"""Errors a user can act on: every problem is gathered, each names the rule and the fix."""

from __future__ import annotations

import sys
from collections.abc import Callable


class HpcmemError(Exception):
    """Base of errors that the CLI prints as a message (never as a traceback)."""


class SpecError(HpcmemError):
    """One or more invalid settings; `problems` holds each message on its own."""

    def __init__(self, problems: list[str] | str):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(f"- {p}" for p in self.problems))


class Problems:
    """Collects problems so that all of them are reported together: the user fixes everything in one go."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, message: str) -> None:
        self.items.append(message)

    def check(self, ok: bool, message: str) -> None:
        if not ok:
            self.items.append(message)

    def raise_if_any(self) -> None:
        if self.items:
            raise SpecError(self.items)


def unreadable(exc: BaseException) -> str:
    """One line for an input file that could not be read or parsed (for tools that must not print a traceback):
    the OS's reason and the file it names, else the parser's complaint, cut to a line."""
    if isinstance(exc, OSError):
        where = f"{exc.filename}: " if exc.filename else "it: "
        return f"cannot read {where}{exc.strerror or exc}"
    text = " ".join(str(exc).split())[:160]
    return f"unexpected content ({type(exc).__name__}: {text})"


def refuse_unreadable(run: Callable[[], int], prog: str, hint: str) -> int:
    """`run()`'s exit code; a file it could not read or parse is refused in one line on stderr (`unreadable`, then
    `hint`: what the file should be) with exit code 2, never a traceback."""
    try:
        return run()
    except (OSError, ValueError, KeyError, TypeError, EOFError) as exc:
        print(f"{prog}: {unreadable(exc)} ({hint})", file=sys.stderr)
        return 2

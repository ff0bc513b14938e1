"""A plan as the flags that turn the user's job into it — the inverse of hpcmem.cli.options, with the same names (TRL's
and accelerate's field names), so `hpcmem estimate … <these flags>` is the plan."""

from __future__ import annotations

import json
import shlex
from dataclasses import fields
from typing import Any

from hpcmem.job.jobspec import JobSpec


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "none"
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    if isinstance(value, (tuple, list)):
        return ",".join(map(str, value))
    return str(value)


def changed_flags(before: JobSpec, after: JobSpec) -> list[str]:
    """`--field value` for every TrainSpec / ParallelSpec field (and the allocator setting) that differs."""
    out: list[str] = []
    for old, new in ((before.train, after.train), (before.parallel, after.parallel)):
        for f in fields(new):
            value = getattr(new, f.name)
            if getattr(old, f.name) != value:
                out += [f"--{f.name}", _text(value)]
    if before.expandable_segments != after.expandable_segments:
        out += ["--expandable_segments", _text(after.expandable_segments)]
    return out


def flags_line(before: JobSpec, after: JobSpec) -> str:
    """The changed flags, shell-quoted for pasting ("(no change)" when the plan is the job itself)."""
    return shlex.join(changed_flags(before, after)) or "(no change)"

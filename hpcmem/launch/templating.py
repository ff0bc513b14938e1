"""Jinja2 for shell scripts: every `{{ value }}` is shell-quoted unless it is marked as trusted shell text.

Where the templates come from, first match wins:
1. `$HPCMEM_TEMPLATES` — an admin's override folder (same file names as the shipped ones);
2. `hpcmem/templates` inside an installed wheel (pyproject force-includes the repository's `templates/` there);
3. `templates/` at the root of a source checkout.

Quoting works like HTML autoescaping: the environment's `finalize` passes every expression through `shlex.quote`,
so a value can never become shell code. Shell snippets that hpcmem builds itself (or that a preset's admin wrote,
such as `setup` lines) are wrapped in `Shell` and pass unchanged. `#SBATCH` values go through `sbatch_quote`
(sbatch's own parser, see there); a directive ends at its line, so values bound for `#SBATCH` must not contain a
newline (checked in `hpcmem.launch.job`).
"""

from __future__ import annotations

import os
import shlex
from functools import lru_cache
from pathlib import Path
from typing import Any

from hpcmem.errors import HpcmemError, SpecError
from hpcmem.inputs.values import shown

ENV_TEMPLATES = "HPCMEM_TEMPLATES"


class Shell(str):
    """Text that is already valid shell (built by hpcmem or written by a preset's admin): not quoted again."""


def _refuse(value: str, rule: str) -> None:
    raise SpecError(f"{rule}; got {shown(value)}")


def quote(value: Any) -> str:
    """Shell-quote one value (`shlex.quote`); booleans and numbers print as themselves, `Shell` text passes.
    A NUL is refused: bash cannot hold one in a string (the input checks refuse it first, naming the field)."""
    if isinstance(value, Shell):
        return str(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    text = str(value)
    if "\x00" in text:
        _refuse(text, "a value bound for the job script must not hold a NUL character")
    return shlex.quote(text)


def sbatch_quote(value: Any) -> Shell:
    """Quote a value for an `#SBATCH` line, which sbatch parses itself (not bash).

    sbatch's directive parser (src/sbatch/opt.c `_get_argument`) honours single/double quotes and treats a backslash
    as an escape even inside quotes, so: single quotes around the value, `\\` and `\'` inside.
    """
    text = str(value)
    if any(ord(c) < 32 or 127 <= ord(c) < 160 for c in text):
        _refuse(text, "an #SBATCH value must not hold control characters (a line break ends the directive)")
    if text and all(c.isalnum() or c in "@%+=:,./-_" for c in text):
        return Shell(text)
    return Shell("'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'")


def join(values: Any) -> Shell:
    """Quote each element and join them with spaces: an argv as one line of shell."""
    return Shell(" ".join(quote(v) for v in values))


def comment(text: Any) -> Shell:
    """Text for after a `#`: one line, whatever it holds (a line break would start a command; other control
    characters become spaces too)."""
    return Shell(" ".join("".join(" " if ord(c) < 32 or 127 <= ord(c) < 160 else c for c in str(text)).split()))


def _finalize(value: Any) -> Any:
    if value is None:
        return ""
    return quote(value)


def template_dirs() -> list[Path]:
    """The folders searched for templates, highest priority first (see the module docstring)."""
    dirs: list[Path] = []
    override = os.environ.get(ENV_TEMPLATES)
    if override:
        dirs.append(Path(override))
    package = Path(__file__).resolve().parent.parent
    dirs.append(package / "templates")            # installed wheel
    dirs.append(package.parent / "templates")     # source checkout
    return [d for d in dirs if d.is_dir()]


@lru_cache(maxsize=8)
def _environment(dirs: tuple[str, ...]):
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(list(dirs)),
        finalize=_finalize,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters["q"] = quote
    env.filters["join_args"] = join
    env.filters["shell"] = Shell
    env.filters["comment"] = comment
    env.filters["sbatch"] = sbatch_quote
    return env


def render(name: str, **context: Any) -> str:
    """Render the template `name` (e.g. "sbatch/multi.sh.j2") with every value shell-quoted."""
    dirs = template_dirs()
    if not dirs:
        raise HpcmemError(f"no template folder found: set {ENV_TEMPLATES} or reinstall hpcmem (templates/ missing)")
    return _environment(tuple(str(d) for d in dirs)).get_template(name).render(**context)


def template_text(name: str) -> str:
    """The file `name` (e.g. "runner/trl_entry.py") as it is, from the first template folder that holds it."""
    for folder in template_dirs():
        path = folder / name
        if path.is_file():
            return path.read_text(encoding="utf-8")
    raise HpcmemError(f"template {name} not found in {[str(d) for d in template_dirs()]}: set {ENV_TEMPLATES} or "
                      "reinstall hpcmem (templates/ incomplete)")

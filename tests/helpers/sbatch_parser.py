"""sbatch's own reading of a script's #SBATCH lines, ported to Python for the tests (SLURM 22.05 src/sbatch/opt.c):
`next_line` splits on '\\n' only and a NUL ends the line (xstrndup); `_opt_batch_script` reads lines starting with
#SBATCH (or #SLURM) and stops at the first line holding anything but whitespace before a '#'; `get_argument` splits
a directive into arguments: whitespace (C isspace) separates, '\\' makes the next character literal (inside quotes
too), '...' and "..." group, an unquoted unescaped '#' starts a comment, an unmatched quote is fatal.

The tests hold hpcmem's rendered scripts to this reading: each directive must come back exactly as hpcmem meant it.
"""

from __future__ import annotations

C_SPACE = " \t\n\v\f\r"


class SbatchFatal(Exception):
    """What sbatch exits on (`fatal()`): the script would not be submitted at all."""


def _argument(line: str, lineno: int) -> tuple[str | None, int]:
    """get_argument: (argument or None when the line is used up, characters consumed)."""
    i = 0
    while i < len(line) and line[i] in C_SPACE:
        i += 1
    for word in ("packjob", "hetjob"):
        end = i + len(word)
        if line[i:end].lower() == word and (end == len(line) or line[end] in C_SPACE):
            line = line[:i] + " " * len(word) + line[end:]
            while i < len(line) and line[i] in C_SPACE:
                i += 1
    if line[i:i + 1] == ":":
        raise SbatchFatal(f"line {lineno}: Unexpected `:`")
    if i >= len(line):
        return None, i
    out: list[str] = []
    quoted, q_char, escape = False, "", False
    while i < len(line) and (quoted or line[i] not in C_SPACE) and line[i] != "\n":
        c = line[i]
        if escape:
            escape = False
        elif c == "\\":
            escape = True
            i += 1
            continue
        elif quoted:
            if c == q_char:
                quoted = False
                i += 1
                continue
        elif c in "\"'":
            quoted, q_char = True, c
            i += 1
            continue
        elif c == "#":
            break
        out.append(c)
        i += 1
    if quoted:
        raise SbatchFatal(f"line {lineno}: Unmatched `{q_char}`")
    return ("".join(out) if out else None), i


def sbatch_arguments(script: str) -> list[str]:
    """The argv sbatch builds from a script's directives (before getopt), in order."""
    args: list[str] = []
    for lineno, line in enumerate(script.split("\n"), 1):
        line = line.split("\x00", 1)[0]
        if line.startswith("#SBATCH"):
            rest = line[len("#SBATCH"):]
        elif line.startswith("#SLURM"):
            rest = line[len("#SLURM"):]
        else:
            stripped = line.lstrip(C_SPACE)
            if stripped and not stripped.startswith("#"):
                break
            continue
        while True:
            arg, used = _argument(rest, lineno)
            if arg is None:
                break
            args.append(arg)
            rest = rest[used:]
    return args

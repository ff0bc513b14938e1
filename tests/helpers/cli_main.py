"""Run `hpcmem` through its real entry point (`hpcmem.cli.main`, argv and exit code as a shell sees them) inside the
test process, and hand back (exit code, stdout, stderr) as pytest's capsys caught them."""

from __future__ import annotations

import sys


def run_main(args: list[str], capsys) -> tuple[int, str, str]:
    from hpcmem.cli import main

    old, sys.argv = sys.argv, ["hpcmem", *args]
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code or 0
    finally:
        sys.argv = old
    out = capsys.readouterr()
    return code, out.out, out.err

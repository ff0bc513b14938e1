"""Run `hpcmem` in a fresh interpreter where some libraries cannot be imported: what the light install (no torch)
sees. `sys.modules[name] = None` makes `import name` raise ImportError."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any


def run_json_without(argv: list[str], blocked: tuple[str, ...]) -> dict[str, Any]:
    """`hpcmem <argv>` (which must include --json) with `blocked` unimportable; its exit status must be 0."""
    code = "\n".join([
        "import contextlib, io, sys",
        f"sys.modules.update(dict.fromkeys({blocked!r}))",
        "from hpcmem.cli import run",
        "buf = io.StringIO()",
        "with contextlib.redirect_stdout(buf):",
        f"    status = run({argv!r})",
        "assert status == 0, status",
        "sys.stdout.write(buf.getvalue())",
    ])
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)

"""The one place hpcmem imports matplotlib: lazily, with the Agg backend (no display), or a one-line error."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Any

from hpcmem.errors import HpcmemError

INSTALL_HINT = "pip install matplotlib (or the [train] extra: pip install 'hpcmem[train]')"
GIB = 1024**3
MARK = "hpcmem"         # the PNG's Software text (hpcmem.cli.outputs.drawn_by_hpcmem reads it back)


def pyplot(what: str = "this picture") -> Any:
    """matplotlib.pyplot on the Agg backend, or an HpcmemError saying how to get it."""
    try:
        import matplotlib
    except ImportError:
        raise HpcmemError(f"{what} needs matplotlib, which this install does not have: {INSTALL_HINT}") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, path: str | Path, *, dpi: Any = 120) -> Path:
    """Write a figure as PNG (parents created) and release it; a path the system refuses is one line. The PNG is
    drawn into a new temporary file beside `path` and renamed over it, so a failed draw leaves what was there, and
    it carries the Software text "hpcmem" (MARK), by which a later --plot knows the file is its own to replace."""
    import matplotlib.pyplot as plt

    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)      # as an ordinary new file (mkstemp makes it 0600)
        with os.fdopen(fd, "wb") as fh:
            fig.savefig(fh, dpi=dpi, format="png", metadata={"Software": MARK})
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        raise HpcmemError(f"cannot write the picture {path}: {exc.strerror or exc}") from None
    finally:
        plt.close(fig)
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    return path

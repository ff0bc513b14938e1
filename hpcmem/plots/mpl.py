"""The one place hpcmem imports matplotlib: lazily, with the Agg backend (no display), or a one-line error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpcmem.errors import HpcmemError

INSTALL_HINT = "pip install matplotlib (or the [train] extra: pip install 'hpcmem[train]')"
GIB = 1024**3


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
    """Write a figure as PNG (parents created) and release it; a path the system refuses is one line."""
    import matplotlib.pyplot as plt

    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=dpi, format="png")
    except OSError as exc:
        raise HpcmemError(f"cannot write the picture {path}: {exc.strerror or exc}") from None
    finally:
        plt.close(fig)
    return path

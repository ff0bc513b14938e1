"""Where hpcmem finds data that a site or a user adds to the package's own (stdlib only).

Each kind of data (`calibrations`, `profiles`, …) lives in a sub-folder of the same name in each of these folders,
searched in this order, first match wins:

1. `$HPCMEM_DATA` — one or more folders, colon-separated (a site's shared install, a test's temporary folder);
2. `/etc/hpcmem` — what a cluster admin installs for every user of a login node;
3. `$XDG_CONFIG_HOME/hpcmem`, by default `~/.config/hpcmem` — one user's own;
4. the package itself (`hpcmem/<kind>/`) — what ships in the wheel.

Presets keep their own search path (`hpcmem.launch.presets`), which follows the same order.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV_DATA = "HPCMEM_DATA"
SYSTEM_DIR = Path("/etc/hpcmem")
PACKAGE_DIR = Path(__file__).resolve().parent


def user_config_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "hpcmem"


def site_dirs() -> list[Path]:
    """The folders above 1–3, highest priority first (they need not exist)."""
    env = [Path(p) for p in os.environ.get(ENV_DATA, "").split(os.pathsep) if p.strip()]
    return [*env, SYSTEM_DIR, user_config_dir()]


def search_dirs(kind: str) -> list[Path]:
    """Every folder that may hold data of `kind`, highest priority first, the package's own last."""
    return [d / kind for d in site_dirs()] + [PACKAGE_DIR / kind]


def write_dir(kind: str) -> Path:
    """Where hpcmem writes data of `kind` it made itself: the first `$HPCMEM_DATA` folder, else the user's."""
    env = [p for p in os.environ.get(ENV_DATA, "").split(os.pathsep) if p.strip()]
    return (Path(env[0]) if env else user_config_dir()) / kind


def estimator_dir() -> Path:
    """`$HPCMEM_ESTIMATOR_DIR`, else the checkout's estimator/ folder, else ./estimator."""
    env = os.environ.get("HPCMEM_ESTIMATOR_DIR")
    if env:
        return Path(env)
    checkout = PACKAGE_DIR.parent / "estimator"
    return checkout if checkout.is_dir() else Path("estimator")

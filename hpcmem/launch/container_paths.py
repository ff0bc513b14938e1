"""Which paths a job's container sees, and the ones the job needs that it would not.

A container preset's `mounts` are what it declares visible inside: pyxis `--container-mounts=SRC[:DST[:FLAGS]]`
(pyxis mounts nothing else of the host), apptainer `--bind SRC[:DST[:OPTS]]` beside apptainer's own default binds
($HOME, /tmp, the working directory, apptainer.conf "mount home/tmp" and its user-bind control). The path inside is
DST, else SRC. Every path the job reads or writes — the run folder (its accelerate, DeepSpeed and TRL files and
logs), the TRL output_dir, HF_HOME and a local model or dataset path — must lie under one of them, else the job dies
inside the container on its first open(); hpcmem refuses it first, naming the mount that would fix it.
"""

from __future__ import annotations

import posixpath
from typing import Any, Mapping

# apptainer's default binds (apptainer.conf: mount home = yes, mount tmp = yes, and the current directory)
APPTAINER_DEFAULTS = ("$HOME", "/tmp")


def inside(mount: str) -> str:
    """The path a mount spec makes visible inside the container (DST when given, else SRC)."""
    parts = mount.split(":")
    return posixpath.normpath(parts[1] if len(parts) > 1 and parts[1].startswith("/") else parts[0])


def visible_roots(kind: str, mounts: tuple[str, ...], *, workdir: str, home: str | None) -> list[str]:
    roots = [inside(m) for m in mounts]
    if kind == "apptainer":
        roots += [workdir] + [home if d == "$HOME" else d for d in APPTAINER_DEFAULTS if d != "$HOME" or home]
    return list(dict.fromkeys(posixpath.normpath(r) for r in roots if r))


def _under(path: str, root: str) -> bool:
    return root == "/" or path == root or path.startswith(root.rstrip("/") + "/")


def needed_paths(run_dir: str, workdir: str, trl_fields: Mapping[str, Any], env: Mapping[str, str]) -> dict[str, str]:
    """What the job reads or writes, by the name the user knows it by, as absolute paths."""
    def absolute(value: Any) -> str | None:
        if not isinstance(value, str) or not value:
            return None
        if value.startswith("/"):
            return posixpath.normpath(value)
        if value.startswith((".", "~")) or "/" not in value:
            return None if value.startswith("~") else posixpath.normpath(posixpath.join(workdir, value))
        return None     # a Hub id (org/name), not a path

    out = {"run folder": posixpath.normpath(run_dir)}
    output = trl_fields.get("output_dir")
    out["output_dir"] = absolute(output) or posixpath.normpath(posixpath.join(run_dir, "output"))
    for name in ("model_name_or_path", "teacher_model_name_or_path", "dataset_name"):
        value = trl_fields.get(name)
        if isinstance(value, str) and value.startswith(("/", "./", "../")):
            out[name] = absolute(value)
    if env.get("HF_HOME", "").startswith("/"):
        out["HF_HOME"] = posixpath.normpath(env["HF_HOME"])
    return {k: v for k, v in out.items() if v}


def invisible(kind: str, mounts: tuple[str, ...], needed: Mapping[str, str], *, workdir: str,
              home: str | None) -> list[str]:
    """One problem per needed path no mount (or default bind) makes visible, with the fix."""
    roots = visible_roots(kind, mounts, workdir=workdir, home=home)
    problems = []
    for what, path in needed.items():
        if not any(_under(path, r) for r in roots):
            top = "/" + path.strip("/").split("/")[0]
            problems.append(f"{what} {path} is not visible inside the {kind} container (it sees "
                            f"{', '.join(roots) or 'no host path'}): add {top} to the preset's container.mounts, "
                            "or place it under a mounted path")
    return problems

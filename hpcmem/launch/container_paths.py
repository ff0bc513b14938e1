"""Which paths a job's container sees, and the ones the job needs that it would not.

A container preset's `mounts` are what it declares visible inside: pyxis `--container-mounts=SRC[:DST[:FLAGS]]`
(pyxis mounts nothing else of the host but, where enroot's ENROOT_MOUNT_HOME says so, the home folder: not relied
on), apptainer `--bind SRC[:DST[:OPTS]]` beside apptainer's own default binds ($HOME, /tmp, the working directory:
apptainer.conf "mount home", "mount tmp"). The path inside is DST, else SRC. hpcmem mounts the run folder itself
(`job_mounts`: its accelerate, DeepSpeed and TRL files, logs and the default output_dir are hpcmem's to place), so
what must lie under a declared mount is what the user names — output_dir, HF_HOME, a local model or dataset path —
else the job dies inside the container on its first open(); hpcmem refuses it first, naming the mount to add.
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


def job_mounts(mounts: tuple[str, ...], run_dir: str) -> tuple[str, ...]:
    """The preset's mounts plus the run folder at its own path (unless a mount already shows it there)."""
    run_dir = posixpath.normpath(run_dir)
    if any(_under(run_dir, inside(m)) and inside(m) == posixpath.normpath(m.split(":")[0]) for m in mounts):
        return tuple(mounts)
    return (*mounts, f"{run_dir}:{run_dir}")


def unmountable(run_dir: str) -> str | None:
    """Why the run folder cannot be given as a mount (pyxis splits its list at ',' and each mount at ':')."""
    bad = [ch for ch in ",:" if ch in run_dir]
    return (f"run folder {run_dir} holds {' and '.join(repr(c) for c in bad)}, which container mount lists split "
            "on; choose another --runs-dir") if bad else None


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
    output = absolute(trl_fields.get("output_dir"))
    if output:
        out["output_dir"] = output
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

"""Probe records: one JSON line per run, appended atomically by any number of concurrent writers (stdlib only).

A record carries the job spec, the estimate made BEFORE the run, what was measured, the versions and the environment
that change memory (allocator settings), and timings. Records live in `estimator/probes/<gpu>.jsonl`, one file per GPU
model (`cpu.jsonl` for CPU runs), so that calibration per GPU reads one file.

Atomic append: the file is opened with O_APPEND, an exclusive `fcntl.flock` is held, and the whole line goes out in
one `os.write` (looping only if the kernel writes short, still under the lock). O_APPEND alone makes each write land
at the end of the file on a local file system; the lock keeps a line whole even on a short write or on file systems
(NFS) where O_APPEND is not atomic between hosts.
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
from dataclasses import asdict, fields
from importlib import metadata
from pathlib import Path
from typing import Any

from hpcmem.gpus import gpu_slug

SCHEMA = 1
PACKAGES = ("torch", "transformers", "trl", "peft", "accelerate", "deepspeed", "datasets", "nvidia-ml-py", "hpcmem")
ALLOC_ENV = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
ENV_KEYS = ALLOC_ENV + ("CUDA_VISIBLE_DEVICES", "NCCL_BUFFSIZE", "NCCL_NVLS_ENABLE", "OMP_NUM_THREADS",
                       "HPCMEM_PROBE_SHARED_GPU")


def expandable_in_env(env: dict[str, str] | None) -> bool:
    """Whether the allocator settings ask for expandable_segments:True. torch reads PYTORCH_CUDA_ALLOC_CONF and, since
    2.9, PYTORCH_ALLOC_CONF, as comma-separated key:value pairs (c10/core/AllocatorConfig.cpp)."""
    for key in ALLOC_ENV:
        for part in (env or {}).get(key, "").replace(" ", "").split(","):
            name, _, value = part.partition(":")
            if name == "expandable_segments" and value.lower() == "true":
                return True
    return False


def ran_expandable(job_data: dict[str, Any] | None, env: dict[str, str] | None) -> bool:
    """Whether a recorded run had expandable segments: its spec asked for them or its allocator environment set them."""
    return bool((job_data or {}).get("expandable_segments", False)) or expandable_in_env(env)


def estimator_dir() -> Path:
    """`$HPCMEM_ESTIMATOR_DIR`, else the checkout's estimator/ folder, else ./estimator."""
    env = os.environ.get("HPCMEM_ESTIMATOR_DIR")
    if env:
        return Path(env)
    checkout = Path(__file__).resolve().parents[2] / "estimator"
    return checkout if checkout.is_dir() else Path("estimator")


def records_path(gpu_name: str | None, root: Path | None = None) -> Path:
    return (root or estimator_dir()) / "probes" / f"{gpu_slug(gpu_name)}.jsonl"


def append_record(path: str | os.PathLike, record: dict[str, Any]) -> None:
    """Append one record as one line; safe under many concurrent writers (processes or hosts sharing the file)."""
    line = (json.dumps(record, sort_keys=True, separators=(",", ":"), default=_jsonable) + "\n").encode()
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(p, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            view = memoryview(line)
            while view:
                written = os.write(fd, view)
                view = view[written:]
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def read_records(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Every record of a JSONL file (a shared lock keeps a writer from appending half-way through the read)."""
    p = Path(path)
    if not p.is_file():
        return []
    with open(p, "rb") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_SH)
        try:
            data = fh.read()
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
    out = []
    for number, raw in enumerate(data.splitlines(), 1):
        if raw.strip():
            try:
                out.append(json.loads(raw))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{p}:{number}: not a JSON record ({exc.msg})") from None
    return out


def read_all(root: Path | None = None) -> list[dict[str, Any]]:
    folder = (root or estimator_dir()) / "probes"
    return [r for f in sorted(folder.glob("*.jsonl")) for r in read_records(f)]


def package_versions() -> dict[str, str | None]:
    """Installed versions read from package metadata (nothing is imported)."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def relevant_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    env = os.environ if environ is None else environ
    return {k: env[k] for k in ENV_KEYS if k in env}


# -- job spec <-> dict ------------------------------------------------------------------------------------------------
def job_to_dict(job: Any) -> dict[str, Any]:
    return json.loads(json.dumps(asdict(job), default=_jsonable))


def job_from_dict(data: dict[str, Any], env: dict[str, str] | None = None) -> Any:
    """Rebuild a JobSpec from `job_to_dict`; keys the current specs no longer have are dropped. `env` is the record's
    allocator environment: a run made under expandable_segments:True is such a job, whatever its spec said."""
    from hpcmem.spec import GpuSpec, JobSpec, ModelSpec, ParallelSpec, TrainSpec

    def build(cls: type, d: dict[str, Any] | None) -> Any:
        if d is None:
            return None
        names = {f.name for f in fields(cls)}
        kw = {k: (tuple(v) if isinstance(v, list) else v) for k, v in d.items() if k in names}
        return cls(**kw)

    return JobSpec(model=build(ModelSpec, data["model"]), train=build(TrainSpec, data["train"]),
                   parallel=build(ParallelSpec, data.get("parallel") or {}), gpu=build(GpuSpec, data.get("gpu")),
                   expandable_segments=ran_expandable(data, env),
                   tokens_per_micro_batch=data.get("tokens_per_micro_batch"))


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    if isinstance(obj, Path):
        return str(obj)
    return str(obj)

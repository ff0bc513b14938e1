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

from hpcmem.errors import SpecError
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


class RecordError(SpecError, ValueError):
    """A records file or record hpcmem cannot read, naming the file, the line and the field (a ValueError too, as
    before it was one of hpcmem's errors)."""


def read_records(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Every record of a JSONL file (a shared lock keeps a writer from appending half-way through the read); the file
    is read within hpcmem.inputs.files' limits and each line must be a JSON object."""
    from hpcmem.inputs.files import MAX_BYTES, check_depth

    p = Path(path)
    if not p.is_file():
        return []
    limit = MAX_BYTES["probe records"]
    with open(p, "rb") as fh:
        if os.fstat(fh.fileno()).st_size > limit:
            raise RecordError(f"probe records {p} are larger than {limit // 2**20} MiB; split the file")
        fcntl.flock(fh.fileno(), fcntl.LOCK_SH)
        try:
            data = fh.read(limit + 1)
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
    out = []
    for number, raw in enumerate(data.splitlines(), 1):
        if raw.strip():
            try:
                record = json.loads(raw.decode("utf-8"))
                check_depth(record, f"{p}:{number}")
            except UnicodeDecodeError as exc:
                raise RecordError(f"{p}:{number}: not UTF-8 text (byte 0x{raw[exc.start]:02x})") from None
            except (json.JSONDecodeError, RecursionError) as exc:
                why = exc.msg if isinstance(exc, json.JSONDecodeError) else "nested too deeply"
                raise RecordError(f"{p}:{number}: not a JSON record ({why})") from None
            if not isinstance(record, dict):
                raise RecordError(f"{p}:{number}: a record is a JSON object; got {type(record).__name__}")
            out.append(record)
    return out


# What `hpcmem validate --against probes` reads of a record: key → the JSON types it may have (None: may be absent).
_RECORD_SHAPE: dict[str, tuple[type, ...]] = {
    "id": (str, int), "source": (str,), "status": (str,), "case": (str,), "device": (str,), "excluded": (str, bool),
    "job": (dict,), "env": (dict,), "gpu": (dict,), "measured": (dict,), "estimate": (dict,), "run": (dict,),
}
_OBJECTS = (("estimate", "per_gpu"), ("measured", "oom"))          # nested objects that may be absent or null
_NUMBERS = {("measured",): ("peak_allocated_bytes", "peak_reserved_bytes", "device_peak_bytes"),
            ("run",): ("capacity_bytes",), ("gpu",): ("memory_bytes",), ("measured", "oom"): ("need_at_least_bytes",),
            ("estimate", "per_gpu"): ("peak_allocated_bytes", "peak_reserved_bytes", "device_peak_bytes")}


def _at(record: dict[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = record
    for key in path:
        node = node.get(key) if isinstance(node, dict) else None
    return node


def check_record(record: dict[str, Any], where: str) -> None:
    """The parts of a record the accuracy tables read have the types they need; RecordError names the first that
    does not (`where` is FILE:LINE)."""
    def bad(field: str, value: Any, rule: str) -> RecordError:
        text = repr(value)
        return RecordError(f"{where}: {field} must be {rule}; got {text if len(text) <= 60 else text[:59] + '…'}")

    for key, kinds in _RECORD_SHAPE.items():
        value = record.get(key)
        if value is not None and not isinstance(value, kinds):
            raise bad(key, value, " or ".join(k.__name__ for k in kinds))
    job = record.get("job")
    if not isinstance(job, dict):
        raise bad("job", job, "an object (the job spec the record ran)")
    for part in ("model", "train"):
        if not isinstance(job.get(part), dict):
            raise bad(f"job.{part}", job.get(part), "an object")
    for part in ("parallel", "gpu"):
        if job.get(part) is not None and not isinstance(job[part], dict):
            raise bad(f"job.{part}", job[part], "an object or null")
    if not isinstance(job["train"].get("trainer"), str):
        raise bad("job.train.trainer", job["train"].get("trainer"), "a trainer name")
    for name, value in (record.get("env") or {}).items():
        if not isinstance(value, str):
            raise bad(f"env.{name}", value, "text")
    if (record.get("gpu") or {}).get("gpu_name") is not None and not isinstance(record["gpu"]["gpu_name"], str):
        raise bad("gpu.gpu_name", record["gpu"]["gpu_name"], "text or null")
    for path in _OBJECTS:
        if _at(record, path) is not None and not isinstance(_at(record, path), dict):
            raise bad(".".join(path), _at(record, path), "an object or null")
    for block, keys in _NUMBERS.items():
        for key in keys:
            value = (_at(record, block) or {}).get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not 0 <= value < 2**63):
                raise bad(".".join((*block, key)), value, "a byte count (a number ≥ 0) or null")


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

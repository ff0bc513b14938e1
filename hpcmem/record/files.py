"""Records files: one JSON line per run, appended atomically by any number of concurrent writers (stdlib only).

Records live in `estimator/probes/<gpu>.jsonl`, one file per GPU model (`cpu.jsonl` for CPU runs), so that
calibration per GPU reads one file; a campaign keeps its own (hpcmem.calibrate.campaign).

Atomic append: the file is opened with O_APPEND, an exclusive `fcntl.flock` is held, and the whole line goes out in
one `os.write` (looping only if the kernel writes short, still under the lock). O_APPEND alone makes each write land
at the end of the file on a local file system; the lock keeps a line whole even on a short write or on file systems
(NFS) where O_APPEND is not atomic between hosts.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Any

from hpcmem.datapath import estimator_dir
from hpcmem.gpus.catalog import gpu_slug
from hpcmem.inputs.files import MAX_BYTES, check_depth
from hpcmem.record.types import Record, RecordError


def records_path(gpu_name: str | None, root: Path | None = None) -> Path:
    return (root or estimator_dir()) / "probes" / f"{gpu_slug(gpu_name)}.jsonl"


def append_record(path: str | os.PathLike, record: Record | dict[str, Any]) -> None:
    """Append one record (a Record, or any JSON object) as one line; safe under many concurrent writers."""
    data = record.to_json() if isinstance(record, Record) else record
    line = (json.dumps(data, sort_keys=True, separators=(",", ":"), default=_jsonable) + "\n").encode()
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


def read_lines(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Every JSON object of a JSONL file (a shared lock keeps a writer from appending half-way through the read); the
    file is read within hpcmem.inputs.files' limits. A missing file has none."""
    p = Path(path)
    if not p.exists():
        return []
    if not p.is_file():     # a FIFO, socket or device is never opened: reading one blocks
        raise RecordError(f"probe records {p} is not a regular file; pass a records file (.jsonl) or a folder of them")
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
                obj = json.loads(raw.decode("utf-8"))
                check_depth(obj, f"{p}:{number}")
            except UnicodeDecodeError as exc:
                raise RecordError(f"{p}:{number}: not UTF-8 text (byte 0x{raw[exc.start]:02x})") from None
            except (json.JSONDecodeError, RecursionError) as exc:
                why = exc.msg if isinstance(exc, json.JSONDecodeError) else "nested too deeply"
                raise RecordError(f"{p}:{number}: not a JSON record ({why})") from None
            if not isinstance(obj, dict):
                raise RecordError(f"{p}:{number}: a record is a JSON object; got {type(obj).__name__}")
            out.append(obj)
    return out


def read_records(path: str | os.PathLike) -> list[Record]:
    """Every record of a records file, checked and upgraded to the current schema (RecordError names FILE:LINE)."""
    return [Record.from_json(obj, f"{path}:{n}") for n, obj in enumerate(read_lines(path), 1)]


def read_all(root: Path | None = None) -> list[Record]:
    folder = (root or estimator_dir()) / "probes"
    return [r for f in sorted(folder.glob("*.jsonl")) for r in read_records(f)]


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    return str(obj)

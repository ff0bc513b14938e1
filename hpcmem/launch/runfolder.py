"""The run folder: everything a submission used, written once, never overwritten.

```
<runs>/<job-name>-<YYYYmmdd-HHMMSS>/
  job.sbatch          the exact script given to sbatch
  accelerate.yaml     generated from the spec (never TRL's shipped configs)
  deepspeed.json      when distributed_type is DEEPSPEED
  trl.yaml            the user's TRL fields + the spec's values + hpcmem's choices
  spec.json           the resolved JobSpec, preset and launch options
  estimate.json       the memory estimate the submission was checked against
  trl_entry.py        a job with images: runs the TRL script with processor.json's keywords (templates/runner/)
  processor.json      the image processor's resolution the estimate assumed
  job_id              written by the backend after submission
  logs/               batch-<jobid>.log, node<N>.log (one per node, appended across requeues), vllm.log
  output/             TRL output_dir unless the user's YAML names another
```
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcmem.errors import HpcmemError
from hpcmem.inputs.files import user_path
from hpcmem.inputs.values import shown
from hpcmem.launch.sbatch import RunFiles

if TYPE_CHECKING:
    from hpcmem.launch.job import Launch

SCRIPT, ACCELERATE, DEEPSPEED, TRL, SPEC, ESTIMATE, JOB_ID = (
    "job.sbatch", "accelerate.yaml", "deepspeed.json", "trl.yaml", "spec.json", "estimate.json", "job_id")
ENTRY, PROCESSOR = "trl_entry.py", "processor.json"


MAX_SLUG = 100        # characters of the job name kept in the folder's name (file systems allow 255 bytes per name)


def new_run_dir(runs_root: str | Path, job_name: str, *, now: dt.datetime | None = None) -> Path:
    """A fresh folder name under `runs_root` (absolute); `-2`, `-3`… when the second already exists. The job name
    is cut to MAX_SLUG characters here only: the job keeps its whole name."""
    stamp = (now or dt.datetime.now()).strftime("%Y%m%d-%H%M%S")
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", job_name).strip("_")[:MAX_SLUG] or "run"
    if not str(runs_root).strip():
        # Path("") is the current folder: an empty --runs-dir would scatter run folders there without a word
        raise HpcmemError(f"--runs-dir {str(runs_root)!r} is empty: name a folder, or leave the flag out for ./runs")
    root = user_path(runs_root).absolute()
    try:
        if root.exists() and not root.is_dir():
            raise HpcmemError(f"runs folder {root} is a file, not a folder; choose another --runs-dir")
        base = root / f"{slug}-{stamp}"
        candidate, n = base, 1
        while candidate.exists():
            n += 1
            candidate = base.with_name(f"{base.name}-{n}")
    except (OSError, ValueError) as exc:       # ValueError: a NUL in the name
        raise HpcmemError(f"cannot use runs folder {str(root)!r}: {getattr(exc, 'strerror', None) or exc}") from None
    return candidate


def run_files(run_dir: Path, *, deepspeed: bool, output_dir: str | None, entry_script: bool = False) -> RunFiles:
    return RunFiles(
        run_dir=str(run_dir), script=str(run_dir / SCRIPT), accelerate_config=str(run_dir / ACCELERATE),
        trl_config=str(run_dir / TRL), logs_dir=str(run_dir / "logs"),
        output_dir=output_dir or str(run_dir / "output"),
        deepspeed_config=str(run_dir / DEEPSPEED) if deepspeed else None,
        entry_script=str(run_dir / ENTRY) if entry_script else None,
    )


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def write(run_dir: Path, contents: dict[str, str]) -> None:
    """Create `run_dir` (it must not exist) with every file, whole or not at all: the files are written into a new
    temporary folder beside it, which is renamed to `run_dir` once all are there (rename(2) refuses an existing
    non-empty folder, and an empty one is refused first); a failure removes the temporary folder."""
    if os.path.lexists(run_dir):
        raise HpcmemError(f"run folder {run_dir} already exists; hpcmem never overwrites a run")
    try:
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix=f".{run_dir.name}.partial-", dir=run_dir.parent))
    except (OSError, ValueError) as exc:
        why = getattr(exc, "strerror", None) or exc
        raise HpcmemError(f"cannot create run folder {str(run_dir)!r}: {why}") from None
    try:
        umask = os.umask(0)
        os.umask(umask)
        partial.chmod(0o777 & ~umask)      # as mkdir would make it (mkdtemp makes 0700)
        (partial / "logs").mkdir()
        for name, text in contents.items():
            path = partial / name
            with open(path, "x", encoding="utf-8") as fh:       # "x": fail rather than overwrite
                fh.write(text)
            if name == SCRIPT:
                path.chmod(0o755)
        if os.path.lexists(run_dir):
            raise FileExistsError(run_dir)
        os.rename(partial, run_dir)
    except FileExistsError:
        shutil.rmtree(partial, ignore_errors=True)
        raise HpcmemError(f"run folder {run_dir} already exists; hpcmem never overwrites a run") from None
    except (OSError, UnicodeError) as exc:
        shutil.rmtree(partial, ignore_errors=True)
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else \
            "a value is not UTF-8 text" if isinstance(exc, UnicodeError) else str(exc)
        raise HpcmemError(f"cannot write the run folder {run_dir}: {why}; nothing was left behind") from None


def spec_json(launch: Launch) -> str:
    """The resolved JobSpec, preset and options of a Launch, as JSON."""
    return json.dumps({"job": _jsonable(launch.job), "preset": _jsonable(launch.preset),
                       "options": _jsonable(launch.options), "run_dir": launch.run_dir}, indent=2, default=str) + "\n"


def record_job_id(run_dir: Path, job_id: str, backend: str) -> None:
    with open(run_dir / JOB_ID, "x") as fh:
        fh.write(f"{job_id}\n")
    with open(run_dir / "backend", "x") as fh:
        fh.write(f"{backend}\n")


# what hpcmem.launch.backends records: sbatch --parsable's job id, or submitit's (N_M for an array task)
_JOB_ID = re.compile(r"\d{1,20}(?:_\d{1,20})?")
_MAX_JOB_ID = 64


def read_job_id(run_dir: str | Path) -> str:
    path = Path(run_dir) / JOB_ID
    if not path.is_file():
        raise HpcmemError(f"{run_dir} has no job_id: not a submitted hpcmem run (a --dry-run writes none)")
    with open(path, "rb") as fh:
        raw = fh.read(_MAX_JOB_ID + 1)
    try:
        job_id = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise HpcmemError(f"{path} is not UTF-8 text; it should hold the job id sbatch gave") from None
    if not _JOB_ID.fullmatch(job_id):
        raise HpcmemError(f"{path} must hold a SLURM job id (digits, N_M for an array task, as sbatch --parsable or "
                          f"submitit gives it); got {shown(job_id)}")
    return job_id

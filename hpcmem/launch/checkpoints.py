"""Whose checkpoints are in an output_dir: a run resumes only checkpoints it wrote.

The job script's first start writes a marker, `<output_dir>/.hpcmem-run-<job id>`, naming the run folder; on a
restart it resumes from the newest complete `checkpoint-N` written after its own marker (templates/sbatch:
`hpcmem_newest_checkpoint`), never from another run's. Before a job is submitted, `foreign` lists the checkpoints
already in its output_dir — another run's by construction, since this run has not started — which `submit` refuses
unless told to share the folder: TRL's `save_total_limit` rotation would delete them, and a reader of the folder
could not tell the runs apart.
"""

from __future__ import annotations

from pathlib import Path

MARKER_PREFIX = ".hpcmem-run-"


def output_path(output_dir: str, workdir: str) -> Path:
    """The output_dir as the job sees it: relative paths resolve in the job's working directory (--chdir)."""
    path = Path(output_dir)
    return path if path.is_absolute() or not workdir else Path(workdir) / path


def checkpoint_dirs(folder: Path) -> list[Path]:
    """checkpoint-N folders (TRL/transformers' naming), oldest step first."""
    try:
        found = [p for p in folder.glob("checkpoint-*") if p.name[len("checkpoint-"):].isdigit() and p.is_dir()]
    except OSError:
        return []
    return sorted(found, key=lambda p: int(p.name[len("checkpoint-"):]))


def owners(folder: Path) -> list[str]:
    """What the hpcmem markers in `folder` say (one line each: the run folder and job id that wrote there)."""
    out = []
    for marker in sorted(folder.glob(MARKER_PREFIX + "*")):
        try:
            out.append(marker.read_text(errors="replace").strip()[:300] or marker.name)
        except OSError:
            out.append(marker.name)
    return out


def own(folder: Path, job_id: str) -> list[Path]:
    """The checkpoints job `job_id` wrote: written after its marker (all of them when it left no marker)."""
    marker = folder / f"{MARKER_PREFIX}{job_id}"
    dirs = checkpoint_dirs(folder)
    try:
        since = marker.stat().st_mtime_ns
    except OSError:
        return dirs
    return [d for d in dirs if _mtime_ns(d / "trainer_state.json", d) > since]


def _mtime_ns(path: Path, fallback: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return fallback.stat().st_mtime_ns


def foreign_message(folder: Path, found: list[Path]) -> str:
    """The refusal when `folder` already holds checkpoints at submission."""
    who = owners(folder)
    whose = f"written by {'; '.join(who)}" if who else "not written by an hpcmem run"
    newest = found[-1].name + (f" and {len(found) - 1} more" if len(found) > 1 else "")
    return (f"output_dir {folder} already holds {newest} from another run ({whose}); TRL's save_total_limit would "
            "delete them and the runs could not be told apart. Choose a fresh output_dir, or pass --reuse-output-dir "
            "(this run then resumes only from its own checkpoints)")

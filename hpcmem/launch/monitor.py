"""Where a submitted run stands: `scontrol show job` (until MinJobAge forgets the job), `squeue` for the pending
reason, `sacct` when accounting exists; plus what the run folder shows (checkpoints, per-node logs).

Every query goes through a Runner (argv → CompletedProcess), so tests feed recorded SLURM output.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from hpcmem.inputs.files import load_yaml_file
from hpcmem.launch import checkpoints as owned
from hpcmem.launch import runfolder
from hpcmem.launch.backends import Runner, run_command

_KEYS = ("JobName", "JobState", "Reason", "RunTime", "TimeLimit", "NodeList", "Restarts", "ExitCode", "SubmitTime",
         "StartTime", "EndTime")


@dataclass(frozen=True)
class JobStatus:
    job_id: str
    state: str                            # SLURM's JobState (PENDING, RUNNING, COMPLETED, …) or UNKNOWN
    source: str                           # which command answered: scontrol, squeue, sacct or none
    fields: dict[str, str] = field(default_factory=dict)
    checkpoints: tuple[str, ...] = ()
    note: str = ""

    def to_json(self) -> dict:
        return {"job_id": self.job_id, "state": self.state, "source": self.source, **self.fields,
                "checkpoints": list(self.checkpoints), "note": self.note}


def parse_scontrol(text: str) -> dict[str, str]:
    """`scontrol show job -o ID`: one line of Key=Value tokens (values may hold spaces only for the last keys)."""
    out: dict[str, str] = {}
    for m in re.finditer(r"(\w+)=(.*?)(?=\s+\w+=|$)", text.strip()):
        out.setdefault(m.group(1), m.group(2))
    return out


def _scontrol(job_id: str, runner: Runner) -> dict[str, str] | None:
    done = runner(["scontrol", "show", "job", "-o", job_id])
    if done.returncode != 0 or "JobState=" not in done.stdout:
        return None
    return parse_scontrol(done.stdout.splitlines()[0])


def _sacct(job_id: str, runner: Runner) -> dict[str, str] | None:
    done = runner(["sacct", "-j", job_id, "-X", "-n", "-P", "--format=JobName,State,Elapsed,NodeList,ExitCode"])
    line = done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else ""
    if not line:
        return None
    name, state, elapsed, nodes, code = (line.split("|") + [""] * 5)[:5]
    return {"JobName": name, "JobState": state.split()[0], "RunTime": elapsed, "NodeList": nodes, "ExitCode": code}


def _squeue(job_id: str, runner: Runner) -> dict[str, str] | None:
    done = runner(["squeue", "-h", "-j", job_id, "-o", "%T|%r|%M|%l|%N"])
    line = done.stdout.strip()
    if done.returncode != 0 or not line:
        return None
    state, reason, elapsed, limit, nodes = (line.split("|") + [""] * 5)[:5]
    return {"JobState": state, "Reason": reason, "RunTime": elapsed, "TimeLimit": limit, "NodeList": nodes}


def checkpoints(run_dir: str | Path) -> tuple[str, ...]:
    """checkpoint-N folders this run wrote in its TRL output_dir (from trl.yaml), oldest first; another run's
    checkpoints in a shared output_dir are left out (hpcmem.launch.checkpoints)."""
    run = Path(run_dir)
    trl = run / runfolder.TRL
    spec = load_yaml_file(trl, "config") if trl.is_file() else {}
    out = owned.output_path(str((spec if isinstance(spec, dict) else {}).get("output_dir", run / "output")),
                            _workdir(run))
    job_id = (run / runfolder.JOB_ID).read_text().strip() if (run / runfolder.JOB_ID).is_file() else ""
    return tuple(str(p) for p in owned.own(out, job_id))


def _workdir(run: Path) -> str:
    import json

    try:
        return json.loads((run / runfolder.SPEC).read_text())["options"]["workdir"]
    except (OSError, ValueError, KeyError):
        return ""


def status(run_dir: str | Path, runner: Runner = run_command) -> JobStatus:
    job_id = runfolder.read_job_id(run_dir)
    found = _scontrol(job_id, runner)
    source = "scontrol"
    if found is not None and found.get("JobState") == "PENDING":
        found.update({k: v for k, v in (_squeue(job_id, runner) or {}).items() if k == "Reason" and v})
    if found is None:
        found, source = _sacct(job_id, runner), "sacct"
    if found is None:
        found, source = _squeue(job_id, runner), "squeue"
    cps = checkpoints(run_dir)
    if found is None:
        note = ("slurmctld no longer knows the job (MinJobAge) and accounting (sacct) is unavailable; "
                "see `hpcmem logs` for how it ended")
        return JobStatus(job_id, "UNKNOWN", "none", {}, cps, note)
    fields = {k: found[k] for k in _KEYS if k in found and k != "JobState"}
    return JobStatus(job_id, found.get("JobState", "UNKNOWN"), source, fields, cps)


def log_files(run_dir: str | Path) -> list[Path]:
    """The run's logs: batch-<jobid>.log (batch shell), node<N>.log (one per node), vllm.log — regular files only
    (a FIFO would block the read forever, a folder cannot be read)."""
    logs = Path(run_dir) / "logs"
    return sorted(p for p in logs.glob("*.log") if p.is_file()) if logs.is_dir() else []


def tail(path: Path, lines: int) -> list[str]:
    with open(path, errors="replace") as fh:
        return list(deque((line.rstrip("\n") for line in fh), maxlen=lines))

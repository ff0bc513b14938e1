"""One campaign case inside its SLURM task (or in turn, `--local`): run it, record it, or say why it failed.

A single-node case is one `hpcmem probe` subprocess (its ranks local, hpcmem.probe.dist) appending its record to the
campaign's records file; its output goes to logs/tasks/<case>.log. A multi-node case runs in three stages of its
job script: `prepare` writes the payload every rank reads (with the estimate made before the run), one SLURM task
per rank runs hpcmem.probe.dist's worker, `finish` merges the ranks into one record (per rank inside).

Idempotent: a case whose run is recorded (ok, or out of memory: both measure) is not run again, whatever restarted
the task. A failure on the first attempt (SLURM_RESTART_COUNT 0) exits RETRY and the script requeues the task once;
a failure after that is recorded in status/<case>.json as failed, with its reason (the last line the run printed).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from hpcmem.calibrate.campaign import Campaign, now
from hpcmem.calibrate.case import CampaignCase
from hpcmem.calibrate.matrix import job_settings
from hpcmem.calibrate.scripts import ALREADY, RETRY
from hpcmem.errors import HpcmemError
from hpcmem.gpus.lookup import gpu_spec
from hpcmem.job.trl_config import build_job
from hpcmem.probe import finished_record
from hpcmem.probe.dist import merge_ranks, read_ranks, write_payload
from hpcmem.probe.dist import rank_worker as worker
from hpcmem.probe.matrix import command_line
from hpcmem.probe.runner import estimate_before
from hpcmem.progress import Progress
from hpcmem.record import append_record


def attempt_number() -> int:
    try:
        return int(os.environ.get("SLURM_RESTART_COUNT") or 0)
    except ValueError:
        return 0


def run_task(camp: Campaign, group: str, index: int, stage: str | None = None, *, local: bool = False) -> int:
    """Run (or finish) one case; the exit status the job script acts on (0, RETRY, ALREADY or 1)."""
    cc = camp.group_case(group, index)
    if cc.name in camp.done():
        print(f"hpcmem: {cc.name} is already recorded in {camp.records_file}; nothing to run", flush=True)
        return ALREADY if stage == "prepare" else 0
    if stage == "give-up":
        return fail(camp, cc, "SLURM refused to requeue the task for its retry (scontrol requeue failed)", 1,
                    final=True)
    if stage == "prepare":
        return prepare(camp, cc)
    if stage == "finish":
        return finish(camp, cc, local=local)
    return run_single(camp, cc, local=local)


def probe_argv(camp: Campaign, cc: CampaignCase) -> list[str]:
    argv = command_line(cc.case, device=camp.data["device"], out=str(camp.records_file), model=cc.case.model,
                        tiny=False, steps=int(camp.data["steps"]))
    return [*argv, "--gpu", camp.data["gpu"]]


def case_env(camp: Campaign, cc: CampaignCase) -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HPCMEM_PROBE_CASE": cc.name, "HPCMEM_CAMPAIGN": camp.name,
            **cc.case.env}


def run_single(camp: Campaign, cc: CampaignCase, *, local: bool) -> int:
    log = camp.root / "logs" / "tasks" / f"{cc.name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a", encoding="utf-8") as fh:
        fh.write(f"\n==== {now()} attempt {attempt_number() + 1} (job {os.environ.get('SLURM_JOB_ID', 'local')})\n")
        fh.flush()
        done = subprocess.run(probe_argv(camp, cc), env=case_env(camp, cc), stdout=fh, stderr=subprocess.STDOUT,
                              check=False)
    if done.returncode == 0 and cc.name in camp.done():
        _write(camp, cc, "done")
        return 0
    return fail(camp, cc, last_line(log), done.returncode, local=local)


def last_line(log: Path) -> str:
    """The reason a run failed: the last non-empty line it printed (hpcmem's one-line error, or Python's last)."""
    try:
        lines = [x.strip() for x in log.read_text(encoding="utf-8", errors="replace").splitlines() if x.strip()]
    except OSError:
        return "no output"
    return (lines[-1] if lines else "no output")[:500]


def fail(camp: Campaign, cc: CampaignCase, reason: str, code: int, *, local: bool = False,
         final: bool = False) -> int:
    """Record a failed attempt: RETRY when this was the task's first attempt under SLURM, else failed for good."""
    status = camp.status(cc.name)
    attempt = len(status.get("attempts") or []) if local else attempt_number()
    status.setdefault("attempts", []).append({"job_id": os.environ.get("SLURM_JOB_ID"), "restart": attempt,
                                              "exit": code, "reason": reason, "time": now()})
    retry = not final and not local and attempt == 0 and "SLURM_JOB_ID" in os.environ
    status.update(case=cc.name, state="retrying" if retry else "failed")
    camp.write_status(cc.name, status)
    print(f"hpcmem: {cc.name} failed (attempt {attempt + 1}): {reason}", flush=True)
    return RETRY if retry else 1


def _write(camp: Campaign, cc: CampaignCase, state: str) -> None:
    status = camp.status(cc.name)
    status.update(case=cc.name, state=state, time=now())
    camp.write_status(cc.name, status)


def _job(camp: Campaign, cc: CampaignCase) -> Any:
    job, _ = build_job(cc.case.trainer, job_settings(cc.case), gpu=gpu_spec(camp.data["gpu"]))
    return job


def work_dir(camp: Campaign, cc: CampaignCase) -> Path:
    return camp.root / "work" / cc.name


def prepare(camp: Campaign, cc: CampaignCase) -> int:
    """A multi-node case's payload for its ranks, the estimate made before the run stored with it."""
    folder = work_dir(camp, cc)
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("rank*.json"):
        old.unlink()
    job = _job(camp, cc)
    estimate, error = estimate_before(job)
    write_payload(folder, job, device=camp.data["device"], steps=int(camp.data["steps"]), warmup_steps=1,
                  capacity_bytes=cc.case.capacity_bytes)
    (folder / "estimate.json").write_text(json.dumps({"estimate": estimate, "error": error, "started": time.time()}))
    return 0


def finish(camp: Campaign, cc: CampaignCase, *, local: bool) -> int:
    """Merge the ranks a multi-node case left into its record (or record why it failed)."""
    folder = work_dir(camp, cc)
    try:
        before = json.loads((folder / "estimate.json").read_text())
        payload = json.loads((folder / "payload.json").read_text())
    except (OSError, ValueError):
        return fail(camp, cc, "the prepare step left no payload", 1, local=local)
    merged = merge_ranks(read_ranks(folder, cc.gpus * cc.nodes))
    os.environ.update(HPCMEM_PROBE_CASE=cc.name, HPCMEM_CAMPAIGN=camp.name)
    try:
        record = finished_record(_job(camp, cc), merged, estimate=before["estimate"], estimate_error=before["error"],
                                 device=payload["device"], steps=payload["steps"], warmup_steps=1,
                                 capacity_bytes=payload.get("capacity_bytes"), started=before["started"])
    except HpcmemError as exc:
        return fail(camp, cc, " ".join(str(exc).split())[-500:], 1, local=local)
    append_record(camp.records_file, record)
    _write(camp, cc, "done")
    return 0


def rank_worker(work: str) -> int:
    """One rank of a multi-node case (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT from the job script)."""
    code = worker(Path(work) / "payload.json", work)
    mine = Path(work) / f"rank{os.environ.get('RANK', '?')}.json"
    status = json.loads(mine.read_text()).get("status") if mine.is_file() else "error"
    # a rank that ran out of memory ends badly, so that srun (--kill-on-bad-exit) stops its peers waiting in a
    # collective; its result is written, and finish records the OOM
    return code or (0 if status == "ok" else 3)


def run_local(camp: Campaign, names: list[str], *, quiet: bool = False) -> dict[str, str]:
    """Every case in turn in this machine's session (no scheduler): one retry each; multi-node cases are skipped.
    Progress goes to stderr (hpcmem.progress), none when `quiet` (--json)."""
    bar = Progress(len(names), "calibrate --local", enabled=not quiet)
    outcome = {}
    groups = {name: (gid, i) for gid, g in camp.data["groups"].items() for i, name in enumerate(g["cases"])}
    for name in names:
        cc = camp.case(name)
        if cc.nodes > 1:
            outcome[name] = "skipped: needs several nodes (submit the campaign to SLURM)"
            bar.advance(detail=f"{name}: {outcome[name]}")
            continue
        gid, index = groups[name]
        code = 1
        for _ in range(2):
            code = run_task(camp, gid, index, local=True)
            if code == 0:
                break
        outcome[name] = "done" if code == 0 else f"failed: {camp.status(name)['attempts'][-1]['reason']}"
        bar.advance(detail=f"{name}: {outcome[name]}")
    bar.close()
    return outcome

"""Plan a campaign for a preset, write its folder and submit it: job arrays, multi-node jobs, the collect job.

`plan(preset, options, runner)` is pure apart from reading the campaign folder and asking SLURM which of its jobs
still run: the cases to run now (the planned ones less those recorded, failed — unless retried — and in flight),
grouped into one job array per GPU count (chunks of at most the preset's max_array_size tasks, each `%K` with K
from --max-parallel), one job per multi-node case and a collect job after all of them (afterany). `submit` writes
the scripts into the campaign folder and submits them in order, recording each job id as soon as SLURM answers; a
campaign with nothing left to run submits nothing.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from hpcmem.calibrate.campaign import Campaign, now
from hpcmem.calibrate.case import CampaignCase
from hpcmem.calibrate.matrix import plan_cases
from hpcmem.calibrate.scripts import COMMAND, Job, render_job
from hpcmem.datapath import ENV_DATA, SYSTEM_DIR, user_config_dir
from hpcmem.errors import HpcmemError
from hpcmem.gpus.lookup import gpu_spec
from hpcmem.inputs.files import is_file
from hpcmem.inputs.values import shown
from hpcmem.launch import slurm_time
from hpcmem.launch.backends import parse_job_id
from hpcmem.launch.presets import Preset

Runner = Callable[[list[str]], subprocess.CompletedProcess]
DEFAULT_ARRAY_SIZE = 1001          # SLURM's MaxArraySize default (slurm.conf(5)): task ids 0..1000


@dataclass(frozen=True, kw_only=True)
class Options:
    campaign_dir: Path
    device: str = "cuda"
    tiny: bool = False
    steps: int = 3
    max_parallel: int = 4
    time: str = "30"                        # each case's job (SLURM's time formats)
    collect_time: str = "20"
    site: str | None = None
    only: str | None = None
    extra_cases: tuple[CampaignCase, ...] = ()
    install_dir: Path | None = None
    retry_failed: bool = False
    command: tuple[str, ...] = COMMAND


@dataclass
class Plan:
    campaign: Campaign
    jobs: list[Job] = field(default_factory=list)
    scripts: dict[str, str] = field(default_factory=dict)      # group → script text
    pending: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)      # case → why it is not submitted now
    notes: list[str] = field(default_factory=list)


def default_install_dir() -> Path:
    """The first $HPCMEM_DATA folder, else /etc/hpcmem when this user may write there, else ~/.config/hpcmem."""
    env = [p for p in os.environ.get(ENV_DATA, "").split(os.pathsep) if p.strip()]
    if env:
        return Path(env[0]).absolute()
    probe = SYSTEM_DIR if SYSTEM_DIR.exists() else SYSTEM_DIR.parent
    return SYSTEM_DIR if os.access(probe, os.W_OK) else user_config_dir()


def cluster_name(runner: Runner) -> str | None:
    """SLURM's ClusterName (`scontrol show config`), the campaign's default site."""
    try:
        done = runner(["scontrol", "show", "config"])
    except (OSError, HpcmemError):
        return None
    m = re.search(r"^ClusterName\s*=\s*(\S+)", done.stdout or "", re.MULTILINE)
    return m.group(1) if done.returncode == 0 and m else None


def running_jobs(runner: Runner, ids: list[str]) -> set[str] | None:
    """Which of `ids` SLURM still knows as queued or running (arrays by their array job id); None if squeue fails."""
    if not ids:
        return set()
    try:
        done = runner(["squeue", "-h", "-o", "%F %i"])
    except (OSError, HpcmemError):
        return None
    if done.returncode != 0:
        return None
    seen = {tok.split("_")[0] for line in done.stdout.splitlines() for tok in line.split()}
    return seen & set(ids)


def _campaign(preset: Preset, opt: Options, runner: Runner) -> Campaign:
    gpu = gpu_spec(preset.gpu)
    root = opt.campaign_dir.absolute()
    if any(ord(c) < 32 or 127 <= ord(c) < 160 or c == "\\" for c in str(root)):
        # the folder reaches #SBATCH --output, which ends at a line break and from which SLURM drops backslashes
        raise HpcmemError(f"--campaign folder must hold no control character or backslash; got {shown(str(root))}")
    if is_file(root / "campaign.json"):
        camp = Campaign.load(root)
        same = (camp.data["preset"], camp.data["gpu_name"], camp.data["device"], camp.data["tiny"])
        if same != (preset.name, gpu.name, opt.device, opt.tiny):
            raise HpcmemError(f"campaign {root} was planned for preset {same[0]} on {same[1]} ({same[2]}"
                              f"{', tiny' if same[3] else ''}); choose another --campaign folder")
        return camp
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        # a new campaign writes its folders (campaign.FOLDERS) into root: never among, or over, the user's files
        raise HpcmemError(f"--campaign {shown(str(root), 400)} holds other files and no campaign.json; a new campaign "
                          "needs a new or empty folder")
    return Campaign.create(root, site=opt.site or cluster_name(runner) or preset.name, preset=preset.name,
                           preset_source=preset.source, gpu=preset.gpu, gpu_name=gpu.name, device=opt.device,
                           tiny=opt.tiny, steps=opt.steps,
                           install_dir=str((opt.install_dir or default_install_dir()).absolute()))


def plan(preset: Preset, opt: Options, runner: Runner, *, models_dir: Path | None = None) -> Plan:
    """What `hpcmem calibrate` would submit now (nothing is written or submitted)."""
    _check(preset, opt)
    camp = _campaign(preset, opt, runner)
    cases, notes = plan_cases(gpu_spec(preset.gpu), gpus_per_node=preset.gpus_per_node, max_nodes=preset.max_nodes,
                              tiny=opt.tiny, models_dir=models_dir or camp.root / "models",
                              extra=list(opt.extra_cases), only=opt.only)
    camp.data["cases"].update({c.name: c.to_json() for c in cases})
    out = Plan(campaign=camp, notes=notes)
    done, failed = camp.done(), camp.failed()
    jobs = camp.submitted_jobs()
    alive = running_jobs(runner, list(jobs))
    if alive is None and jobs:
        out.notes.append("squeue did not answer: jobs of earlier submissions are assumed finished")
    in_flight = {case for jid in (alive or set()) for case in jobs[jid]}
    for c in cases:
        why = ("recorded" if c.name in done else
               f"failed: {failed[c.name]}" if c.name in failed and not opt.retry_failed else
               "in flight" if c.name in in_flight else None)
        if why:
            out.skipped[c.name] = why
        else:
            out.pending.append(c.name)
    _group(out, {c.name: c for c in cases}, preset, opt)
    return out


def _check(preset: Preset, opt: Options) -> None:
    for label, text in (("--time", opt.time), ("--collect-time", opt.collect_time)):
        try:
            limit = slurm_time.parse(text)
        except ValueError as exc:
            raise HpcmemError(f"{label}: {exc}") from None
        if not limit.fits_within(preset.max_time_limit):
            raise HpcmemError(f"{label} {text} exceeds preset {preset.name}'s max_time {preset.max_time}")
    if opt.max_parallel < 1:
        raise HpcmemError(f"--max-parallel must be ≥ 1; got {opt.max_parallel}")


def _group(out: Plan, cases: dict[str, CampaignCase], preset: Preset, opt: Options) -> None:
    """One array per GPU count (chunked below max_array_size), one job per multi-node case, then the collect job."""
    n = sum(1 for g in out.campaign.data["groups"].values() if g.get("kind") == "collect") + 1
    size = preset.max_array_size or DEFAULT_ARRAY_SIZE
    by_gpus: dict[int, list[str]] = {}
    for name in out.pending:
        c = cases[name]
        if c.nodes > 1:
            out.jobs.append(Job(group=f"s{n}-m{len(out.jobs)}", kind="multi", cases=(name,), gpus=c.gpus,
                                nodes=c.nodes))
        else:
            by_gpus.setdefault(c.gpus, []).append(name)
    for gpus, names in sorted(by_gpus.items()):
        for start in range(0, len(names), size):
            chunk = tuple(names[start:start + size])
            out.jobs.append(Job(group=f"s{n}-g{gpus}-{start // size}", kind="array", cases=chunk, gpus=gpus,
                                max_parallel=min(opt.max_parallel, len(chunk))))
    out.jobs.sort(key=lambda j: (j.kind != "array", j.group))
    if out.jobs:
        out.jobs.append(Job(group=f"s{n}-collect", kind="collect", cases=(), gpus=0))
    for job in out.jobs:
        time = opt.collect_time if job.kind == "collect" else opt.time
        out.scripts[job.group] = render_job(job, preset, campaign_dir=str(out.campaign.root),
                                            campaign_name=out.campaign.name, time=time, command=opt.command)


def record(p: Plan) -> None:
    """Write the campaign folder with this plan's jobs (their ids follow as they are submitted)."""
    camp = p.campaign
    for job in p.jobs:
        camp.data["groups"][job.group] = {"kind": job.kind, "cases": list(job.cases), "gpus": job.gpus,
                                          "nodes": job.nodes, "script": f"scripts/{job.group}.sbatch", "job_id": None}
    camp.data["notes"] = p.notes
    camp.save()


def submit(p: Plan, runner: Runner) -> list[dict[str, Any]]:
    """Write the scripts, submit every job (the collect job last, afterany all of them); each job id is saved in
    campaign.json as SLURM gives it. Returns one line per job submitted."""
    camp = p.campaign
    record(p)
    done, ids = [], []
    for job in p.jobs:
        script = camp.root / "scripts" / f"{job.group}.sbatch"
        script.write_text(p.scripts[job.group], encoding="utf-8")
        script.chmod(0o755)
        argv = ["sbatch", "--parsable"] + ([f"--dependency=afterany:{':'.join(ids)}"] if job.kind == "collect" else [])
        answer = runner([*argv, str(script)])
        if answer.returncode != 0:
            said = (answer.stderr or answer.stdout).strip() or f"exit status {answer.returncode}"
            raise HpcmemError(f"sbatch refused {script.name}: {said} ({len(done)} job(s) of this campaign were "
                              "submitted before it and are recorded in campaign.json)")

        job_id = parse_job_id(answer.stdout)
        ids.append(job_id)
        camp.data["groups"][job.group].update(job_id=job_id, submitted=now())
        camp.save()
        done.append({"group": job.group, "kind": job.kind, "job_id": job_id, "cases": len(job.cases),
                     "script": str(script)})
    return done


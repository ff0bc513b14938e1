"""The campaign's job scripts (pure): one per job array, per multi-node case and per collect job.

Every script is templates/sbatch/calibrate.sh.j2: the preset's #SBATCH allocation, its environment (the same
sbatch/setup.sh.j2 as `hpcmem submit`: modules, setup lines, env, the rendezvous address and port), then the steps.
Every value is a shell-quoted word (hpcmem.launch.templating) or an #SBATCH value quoted as sbatch parses it; the
steps are argv lists joined by `join`, and the few `$VARIABLES` (`$SLURM_ARRAY_TASK_ID`, the rank of a task) are
fixed text that expands in the task. With a preset container every hpcmem step runs inside it (pyxis:
`srun --container-image`, apptainer: `apptainer exec --nv`).

  array    hpcmem calibrate --run-task DIR --group G --index $SLURM_ARRAY_TASK_ID        (one case per task)
  multi    … --stage prepare; srun one task per rank: hpcmem calibrate --rank-worker WORK; … --stage finish
  collect  hpcmem calibrate --collect DIR                        (submitted with --dependency=afterany:<jobs>)
A task that fails on its first attempt exits RETRY; the script then asks SLURM to requeue it (`scontrol requeue`,
the job was submitted with --requeue) and the restarted task (SLURM_RESTART_COUNT 1) runs once more; its failure
is then recorded, with its reason, in status/<case>.json. Before any step, the job checks that `hpcmem` runs where
its steps run (in the container, after the setup lines) and otherwise exits NO_HPCMEM with one line saying what to fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpcmem.launch.job import PORT_BASE, PORT_SPAN
from hpcmem.launch.presets import Preset
from hpcmem.launch.sbatch import EnvVar, filename_pattern, preset_allocation
from hpcmem.launch.templating import Shell, join, render

RETRY = 75                  # EX_TEMPFAIL: "try again later" (sysexits.h)
ALREADY = 10                # a multi-node case's prepare step: a run of it is already recorded
COMMAND = ("hpcmem",)       # on the nodes: the preset's setup lines / container put hpcmem on PATH
NO_HPCMEM = 78              # EX_CONFIG (sysexits.h): the job's environment cannot run hpcmem; not retried
COLLECT_MEMORY_GB = 8       # re-estimating and fitting a few hundred records, drawing one PNG


@dataclass(frozen=True, kw_only=True)
class Job:
    """One script to submit: its group id, what it runs and the allocation it asks for."""

    group: str
    kind: str                 # array | multi | collect
    cases: tuple[str, ...]
    gpus: int                 # per node
    nodes: int = 1
    max_parallel: int = 0     # the array's %K


def _wrapped(preset: Preset, argv: list[Any], *, tasks: str = "") -> Shell:
    """argv as one shell line, inside the preset's container when it has one."""
    box = preset.container
    if box is not None and box.kind == "apptainer":
        argv = ["apptainer", "exec", "--nv", *[f"--bind={m}" for m in box.mounts], *box.options, box.image, *argv]
    elif box is not None and box.kind == "pyxis":
        mounts = [f"--container-mounts={','.join(box.mounts)}"] if box.mounts else []
        srun = ["srun", "--nodes=1", "--ntasks=1", f"--container-image={box.image}", *mounts, *box.options]
        argv = [*srun, *argv]
    return join(argv)


def preflight(preset: Preset, command: tuple[str, ...]) -> tuple[Shell, Shell]:
    """The check every campaign job runs first — `hpcmem --version` where its steps run (inside the preset's container
    when it has one) — and the `echo` of the one line it prints when that fails."""
    box = preset.container
    where = (f"inside the preset's {box.kind} image {box.image}: install hpcmem in the image, or bind a virtual "
             "environment that has it (the preset's mounts) and put its bin/ on PATH in the preset's setup lines"
             if box is not None else
             "after the preset's modules and setup lines: add a setup line that activates an environment with "
             "hpcmem installed")
    return (_wrapped(preset, [*command, "--version"]),
            join(["echo", f"hpcmem: this calibration job cannot run `{' '.join(command)}` {where}; nothing was "
                  f"measured (exit {NO_HPCMEM}, not retried)"]))


def _environment(preset: Preset, cpus: int) -> list[EnvVar]:
    return [EnvVar("PYTHONUNBUFFERED", "1", "task output reaches the logs as it happens"),
            EnvVar("OMP_NUM_THREADS", str(max(1, cpus)), "the CPUs this task was given"),
            EnvVar("SRUN_CPUS_PER_TASK", str(cpus), "since SLURM 22.05 srun does not inherit --cpus-per-task"),
            *[EnvVar(k, v, f"preset {preset.name}") for k, v in preset.env.items()]]


def _directives(job: Job, preset: Preset, campaign_dir: str, *, time: str, cpus: int,
                memory_gb: int | None) -> list[tuple[str, Any]]:
    logs = filename_pattern(f"{campaign_dir}/logs")
    out = {"array-%A_%a.log" if job.kind == "array" else f"{job.group}-%j.log": None}
    # a multi-node case: one task per rank (srun inside starts them); else one task that starts its own ranks
    d: dict[str, Any] = {"job-name": f"hpcmem-cal-{job.group}", "partition": preset.partition, "nodes": job.nodes,
                         "ntasks-per-node": job.gpus if job.kind == "multi" else 1, "cpus-per-task": cpus,
                         "time": time,
                         "output": f"{logs}/{next(iter(out))}", "open-mode": "append",
                         **preset_allocation(preset, job.gpus, memory_gb=memory_gb)}
    if job.kind == "array":
        d["array"] = f"0-{len(job.cases) - 1}%{job.max_parallel}"
    d["requeue" if job.kind != "collect" else "no-requeue"] = None
    return sorted(d.items())


def _steps(job: Job, preset: Preset, campaign_dir: str, command: tuple[str, ...]) -> tuple[list[Shell], Shell]:
    """The script's steps, and the step that records a failure when SLURM refuses the retry."""
    base = [*command, "calibrate"]
    if job.kind == "collect":
        return [_wrapped(preset, [*base, "--collect", campaign_dir])], Shell("")
    index = Shell('"$SLURM_ARRAY_TASK_ID"') if job.kind == "array" else 0
    task = [*base, "--run-task", campaign_dir, "--group", job.group, "--index", index]
    give_up = _wrapped(preset, [*task, "--stage", "give-up"])
    if job.kind == "array":
        return [_wrapped(preset, task)], give_up
    work = f"{campaign_dir}/work/{job.cases[0]}"
    rank = Shell('export RANK="$SLURM_PROCID" LOCAL_RANK="$SLURM_LOCALID" WORLD_SIZE="$SLURM_NTASKS" '
                 f'LOCAL_WORLD_SIZE={job.gpus}; exec ') + join([*command, "calibrate", "--rank-worker", work])
    box = preset.container
    srun = ["srun", f"--nodes={job.nodes}", f"--ntasks={job.nodes * job.gpus}", f"--ntasks-per-node={job.gpus}",
            "--kill-on-bad-exit=1", "--wait=120"]
    if box is not None and box.kind == "pyxis":
        srun += [f"--container-image={box.image}",
                 *([f"--container-mounts={','.join(box.mounts)}"] if box.mounts else []), *box.options]
    inner = ["bash", "-c", str(rank)]
    if box is not None and box.kind == "apptainer":
        inner = ["apptainer", "exec", "--nv", *[f"--bind={m}" for m in box.mounts], *box.options, box.image, *inner]
    prepare = _wrapped(preset, [*task, "--stage", "prepare"])
    finish = _wrapped(preset, [*task, "--stage", "finish"])
    # prepare exits 0 when the case has yet to run, ALREADY when a run of it is recorded (then nothing runs)
    return [Shell(f"{prepare}; prepared=$?\n"
                  f"if (( prepared == 0 )); then {join([*srun, *inner])}; {finish}\n"
                  f"elif (( prepared == {ALREADY} )); then true; else (exit \"$prepared\"); fi")], give_up


def _resources(job: Job, preset: Preset) -> tuple[int, int | None]:
    """CPUs per task and memory (GB, None: the partition's default): the job's share of a node's, by GPUs."""
    share = job.gpus / preset.gpus_per_node if job.gpus else 0.0
    cpus = max(1, int(preset.cpus_per_node * share)) if job.kind != "collect" else min(2, preset.cpus_per_node)
    if job.kind == "multi":
        cpus = max(1, cpus // job.gpus)                     # per rank
    memory = (max(1, int(preset.memory_per_node_gb * share)) if preset.memory_per_node_gb and share else None)
    if job.kind == "collect":       # without the preset's memory per node, the partition's default
        memory = min(COLLECT_MEMORY_GB, preset.memory_per_node_gb) if preset.memory_per_node_gb else None
    return cpus, memory


def job_directives(job: Job, preset: Preset, *, campaign_dir: str, time: str) -> list[tuple[str, Any]]:
    """(option, value) pairs of the job's #SBATCH lines, sorted; value None → a bare flag."""
    cpus, memory = _resources(job, preset)
    return _directives(job, preset, campaign_dir, time=time, cpus=cpus, memory_gb=memory)


def render_job(job: Job, preset: Preset, *, campaign_dir: str, campaign_name: str, time: str,
               command: tuple[str, ...] = COMMAND) -> str:
    """The whole script of one campaign job."""
    cpus, _ = _resources(job, preset)
    steps, give_up = _steps(job, preset, campaign_dir, command)
    check, check_error = preflight(preset, command)
    what = {"array": f"job array of {len(job.cases)} single-node case(s) on {job.gpus} GPU(s) each",
            "multi": f"case {job.cases[0] if job.cases else '-'} on {job.nodes} node(s) × {job.gpus} GPU(s)",
            "collect": "the collect job (merge, fit, report, install)"}[job.kind]
    return render("sbatch/calibrate.sh.j2", what=what, campaign_name=campaign_name,
                  directives=job_directives(job, preset, campaign_dir=campaign_dir, time=time),
                  files={"run_dir": campaign_dir}, env=_environment(preset, cpus), modules=preset.modules,
                  setup=[Shell(s) for s in preset.setup], port_base=PORT_BASE, port_span=PORT_SPAN,
                  steps=steps, retry=job.kind != "collect", retry_code=RETRY, give_up=give_up,
                  preflight=check, preflight_error=check_error, preflight_code=NO_HPCMEM)

"""Backends: where a prepared run goes. `DryRun` (nothing), `Sbatch` (primary), `Submitit` (Python users).

Every command goes through a `Runner` (argv → CompletedProcess), so tests replace the scheduler with a recorder and
the slurm test tier with a real slurmctld. Commands are argv lists, never a shell string.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Protocol

from hpcmem.errors import HpcmemError
from hpcmem.launch.sbatch import allocation, task_argv, template_context
from hpcmem.launch.templating import render

if TYPE_CHECKING:
    from hpcmem.launch.submission import Prepared

Runner = Callable[[list[str]], subprocess.CompletedProcess]


def run_command(argv: list[str], timeout_s: float = 120) -> subprocess.CompletedProcess:
    """The real runner: no shell, text output captured, never raises on a non-zero exit; a command that is missing,
    cannot be run or does not answer within `timeout_s` is an HpcmemError naming it."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except FileNotFoundError:
        raise HpcmemError(f"{argv[0]} not found: is SLURM installed here (or use --backend dry-run)?") from None
    except subprocess.TimeoutExpired:
        raise HpcmemError(f"{argv[0]} did not answer within {timeout_s:g} s: is the SLURM controller reachable "
                          "from here?") from None
    except OSError as exc:
        raise HpcmemError(f"{argv[0]} cannot be run ({exc.strerror or exc}): check the SLURM install on PATH") \
            from None


class SubmitError(HpcmemError):
    """SLURM refused the job; the message carries SLURM's words and what hpcmem asked for."""


@dataclass(frozen=True)
class Submitted:
    backend: str
    job_id: str | None
    detail: str = ""
    handle: Any = None          # the submitit Job for the submitit backend


class Backend(Protocol):
    name: str

    def submit(self, prepared: Prepared) -> Submitted: ...


@dataclass
class DryRun:
    """Writes the run folder and submits nothing; the script printed is exactly what sbatch would get."""

    name: str = "dry-run"

    def submit(self, prepared: Prepared) -> Submitted:
        return Submitted(self.name, None, f"dry run: nothing submitted; sbatch {prepared.files.script}")


_JOB_ID = re.compile(r"^(\d+)(?:;\S+)?$|Submitted batch job (\d+)")


def parse_job_id(stdout: str) -> str:
    """`sbatch --parsable` prints `jobid[;cluster]`; plain sbatch prints `Submitted batch job N`."""
    for line in stdout.strip().splitlines():
        m = _JOB_ID.search(line.strip())
        if m:
            return m.group(1) or m.group(2)
    raise SubmitError(f"could not read a job id from sbatch's output: {stdout.strip()!r}")


@dataclass
class Sbatch:
    """`sbatch --test-only` first (SLURM validates the request without queueing it), then `sbatch --parsable`."""

    runner: Runner = field(default=run_command)
    preflight: bool = True
    name: str = "sbatch"

    def test_only(self, prepared: Prepared) -> str:
        done = self.runner(["sbatch", "--test-only", prepared.files.script])
        if done.returncode != 0:
            raise SubmitError(_refusal("sbatch --test-only", done, prepared))
        return (done.stderr or done.stdout).strip()   # "sbatch: Job N to start at … on nodes …" (stderr)

    def submit(self, prepared: Prepared) -> Submitted:
        detail = self.test_only(prepared) if self.preflight else ""
        done = self.runner(["sbatch", "--parsable", prepared.files.script])
        if done.returncode != 0:
            raise SubmitError(_refusal("sbatch", done, prepared))
        return Submitted(self.name, parse_job_id(done.stdout), detail)


def _refusal(what: str, done: subprocess.CompletedProcess, prepared: Prepared) -> str:
    launch = prepared.launch
    said = " ".join((done.stderr or done.stdout).split()) or f"exit status {done.returncode}"
    return (f"{what} rejected the job: {said}; "
            f"hpcmem asked partition {launch.preset.partition!r} for {launch.nodes} node(s) × "
            f"{launch.gpus_per_node} GPU(s) × {launch.cpus_per_task} CPUs for {launch.time}; "
            f"check the preset against the cluster with `hpcmem presets check {launch.preset.name}` "
            f"(script: {prepared.files.script})")


@dataclass
class Submitit:
    """submitit's AutoExecutor runs the same per-task command under its own sbatch script.

    submitit writes its own sbatch file (sorted `#SBATCH` lines, the `slurm_setup` lines, then `srun … python -m
    submitit.core._submit`); each task runs hpcmem's per-node `bash -c` launcher through
    `submitit.helpers.CommandFunction`, so `$SLURM_NODEID` still expands inside each task. Its requeue pickles Python callables and uses a
    step-wide USR2 (which kills `accelerate launch` mid-save), so `--requeue` stays with the sbatch backend.
    """

    name: str = "submitit"
    cluster: str | None = None     # None: auto (slurm when sbatch exists); "local"/"debug" for tests

    def submit(self, prepared: Prepared) -> Submitted:
        import submitit

        launch = prepared.launch
        if launch.options.requeue:
            raise HpcmemError("--requeue needs the sbatch backend (submitit's requeue is step-wide USR2 + pickles)")
        if self.cluster in (None, "slurm"):
            # submitit calls sbatch itself and, when it cannot run, ends in FailedJobError after its own retries;
            # asking sbatch for its version first answers in one line, at once
            done = run_command(["sbatch", "--version"], timeout_s=30)
            if done.returncode != 0:
                said = " ".join((done.stderr or done.stdout).split())[:200] or f"exit status {done.returncode}"
                raise SubmitError(f"sbatch cannot run here ({said}); submitit submits through it")
        folder = f"{prepared.files.run_dir}/submitit/%j"
        try:
            executor = submitit.AutoExecutor(folder=folder, cluster=self.cluster)
            executor.update_parameters(**self.parameters(prepared, executor.cluster))
            job = executor.submit(submitit.helpers.CommandFunction(task_argv(launch, prepared.files), verbose=True))
        except HpcmemError:
            raise
        except Exception as exc:  # noqa: BLE001 - submitit's failures (FailedJobError, RuntimeError …) as one line
            said = " ".join(str(exc).split())[:300]
            raise SubmitError(f"submitit could not submit the job ({type(exc).__name__}: {said})") from None
        return Submitted(self.name, str(job.job_id), f"submitit folder {folder}", handle=job)

    def script(self, prepared: Prepared) -> str:
        """The sbatch file submitit would write for this job (its own #SBATCH lines, setup and srun), for
        `--dry-run`. submitit has no public renderer: its SlurmExecutor's `_make_submission_file_text` is what
        `submit` calls (submitit/slurm/slurm.py), given the command its `_submitit_command_str` names."""
        import submitit

        folder = f"{prepared.files.run_dir}/submitit/%j"
        try:
            executor = submitit.AutoExecutor(folder=folder, cluster="slurm")
        except RuntimeError as exc:         # no srun: not a SLURM host
            raise HpcmemError(f"submitit writes its script only where SLURM runs ({exc}); `--backend sbatch "
                              "--dry-run` shows hpcmem's own script") from None
        executor.update_parameters(**self.parameters(prepared, "slurm"))
        inner = executor._executor
        return inner._make_submission_file_text(inner._submitit_command_str, "dry-run")

    @staticmethod
    def parameters(prepared: Prepared, cluster: str) -> dict[str, Any]:
        """The same allocation, environment (templates/sbatch/setup.sh.j2) and per-node launcher as the script."""
        launch = prepared.launch
        if launch.vllm_server:
            raise HpcmemError("the submitit backend runs one launcher per node; vllm_mode server needs sbatch")
        # submitit writes --time=<timeout_min>; 0 is SLURM's "no limit" (slurm_opt.c arg_set_time_limit)
        params: dict[str, Any] = {"name": launch.job_name, "timeout_min": launch.time_min or 0, "nodes": launch.nodes,
                                  "tasks_per_node": 1, "cpus_per_task": launch.cpus_per_task}
        if cluster == "slurm":
            params.update(
                slurm_partition=launch.preset.partition,
                slurm_setup=[render("sbatch/setup.sh.j2", **template_context(launch, prepared.files))],
                slurm_srun_args=["--kill-on-bad-exit=1", "--wait=60"],
                slurm_additional_parameters=allocation(launch),   # gres or gpus-per-node, mem, account, qos, chdir
            )
        return params


BACKENDS = {"dry-run": DryRun, "sbatch": Sbatch, "submitit": Submitit}


def backend(name: str, **kwargs) -> Backend:
    if name not in BACKENDS:
        raise HpcmemError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
    return BACKENDS[name](**kwargs)

"""From specs to a submitted job: prepare (pure: every file's text), check the fit, write the run folder, submit.

`submit(...)` is the Python API behind `hpcmem submit`; with `backend="submitit"` it returns the submitit Job.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from hpcmem.errors import HpcmemError
from hpcmem.job.images import processor_kwargs
from hpcmem.launch import checkpoints, runfolder
from hpcmem.launch.backends import Runner, SubmitError, Submitted
from hpcmem.launch.backends import backend as make_backend
from hpcmem.launch.configs import accelerate_config, deepspeed_config
from hpcmem.launch.fit import FitReport, check_fit
from hpcmem.launch.job import Launch, LaunchOptions, default_job_name
from hpcmem.launch.presets import Preset
from hpcmem.launch.sbatch import RunFiles, render_sbatch
from hpcmem.launch.templating import template_text
from hpcmem.launch.trl_yaml import trl_config

if TYPE_CHECKING:
    from hpcmem.job.jobspec import JobSpec


class DoesNotFit(HpcmemError):
    """The verdict is "tight" or "does not fit" (hpcmem.estimate.verdict); the message gives the numbers and the
    changes whose safe bound fits."""

    def __init__(self, report: FitReport):
        self.report = report
        super().__init__(report.message())


@dataclass(frozen=True)
class Prepared:
    launch: Launch
    files: RunFiles
    contents: dict[str, str]          # run-folder file name → text
    fit: FitReport | None


def _yaml(data: dict[str, Any]) -> str:
    import yaml

    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True)


def _with_preset_gpu(job: JobSpec, preset: Preset) -> JobSpec:
    gpu = preset.gpu_spec()
    return job if job.gpu == gpu else dataclasses.replace(job, gpu=gpu)


def prepare(job: JobSpec, preset: Preset, options: LaunchOptions, *, runs_root: str | Path = "runs",
            run_dir: str | Path | None = None, estimator: Callable | None = None, fit: bool = True) -> Prepared:
    """Every file of the run folder as text, and the fit verdict; writes nothing."""
    job = _with_preset_gpu(job, preset)
    if not options.workdir:
        options = dataclasses.replace(options, workdir=os.getcwd())
    name = default_job_name(options, job.train.trainer)
    folder = Path(run_dir).absolute() if run_dir else runfolder.new_run_dir(runs_root, name)
    launch = Launch(job=job, preset=preset, options=options, run_dir=str(folder))
    launch.check()
    # a job with images runs through trl_entry.py, which hands the estimate's image bounds to the processor (no TRL
    # field reaches it); a user's own --entry builds its own processor (Launch.warnings says so)
    processor = processor_kwargs(job.train, job.model.vision) if not options.entry else {}
    files = runfolder.run_files(folder, deepspeed=job.parallel.deepspeed,
                                output_dir=options.trl_fields.get("output_dir"), entry_script=bool(processor))
    report = check_fit(job, estimator=estimator, memory_per_node_bytes=preset.memory_per_node_bytes) if fit else None
    contents = {
        runfolder.ACCELERATE: _yaml(accelerate_config(job, deepspeed_config_file=files.deepspeed_config,
                                                      use_cpu=launch.use_cpu)),
        runfolder.TRL: _yaml(trl_config(job, options.trl_fields, output_dir=files.output_dir)),
        runfolder.SCRIPT: render_sbatch(launch, files),
        runfolder.SPEC: runfolder.spec_json(launch),
        runfolder.ESTIMATE: _estimate_json(report),
    }
    if processor:
        contents[runfolder.ENTRY] = template_text("runner/trl_entry.py")
        contents[runfolder.PROCESSOR] = json.dumps(processor, indent=2) + "\n"
    if job.parallel.deepspeed:
        contents[runfolder.DEEPSPEED] = json.dumps(deepspeed_config(job), indent=2) + "\n"
    return Prepared(launch=launch, files=files, contents=contents, fit=report)


def _estimate_json(report: FitReport | None) -> str:
    if report is None:
        return json.dumps({"checked": False}, indent=2) + "\n"
    data = {"checked": True, **report.estimate_json, "fits": report.fits,
            "host_check": None if report.host is None else {
                "fits": report.host.fits, "per_node_bytes": report.host.need_bytes,
                "capacity_bytes": report.host.capacity_bytes, "phase": report.host.phase},
            "fixes": [{"flags": f.flags, "device_peak_bytes": f.device_peak_bytes,
                       "safe_device_peak_bytes": f.safe_device_peak_bytes} for f in report.fixes]}
    return json.dumps(data, indent=2) + "\n"


def submit(job: JobSpec, preset: Preset, options: LaunchOptions | None = None, *, backend: str = "sbatch",
           runs_root: str | Path = "runs", run_dir: str | Path | None = None, force: bool = False,
           runner: Runner | None = None, estimator: Callable | None = None, **backend_kwargs):
    """Check the fit, write the run folder, submit. Returns a `Submission`, or the submitit Job for backend="submitit".

    Refuses (DoesNotFit, nothing written) when the verdict is "tight" or "does not fit", unless `force`.
    """
    options = options or LaunchOptions()
    prepared = prepare(job, preset, options, runs_root=runs_root, run_dir=run_dir, estimator=estimator)
    if prepared.fit is not None and not prepared.fit.fits and not force:
        raise DoesNotFit(prepared.fit)
    _refuse_foreign_checkpoints(prepared)
    if runner is not None:
        backend_kwargs["runner"] = runner
    chosen = make_backend(backend, **backend_kwargs)
    runfolder.write(Path(prepared.files.run_dir), prepared.contents)
    try:
        result: Submitted = chosen.submit(prepared)
    except HpcmemError as exc:
        if type(exc) not in (SubmitError, HpcmemError):     # a subclass with its own fields: as it is
            raise
        # the folder this call created is kept (it holds the script the scheduler refused or never saw) and named
        raise type(exc)(f"{exc}; run folder {prepared.files.run_dir} kept, nothing submitted ({runfolder.SCRIPT} is "
                        "the script as written; remove the folder to start over)") from None
    if result.job_id is not None:
        runfolder.record_job_id(Path(prepared.files.run_dir), result.job_id, chosen.name)
    return result.handle if backend == "submitit" else Submission(result, prepared)


def _refuse_foreign_checkpoints(prepared: Prepared) -> None:
    """An output_dir that already holds checkpoints holds another run's (hpcmem.launch.checkpoints)."""
    opt = prepared.launch.options
    folder = checkpoints.output_path(prepared.files.output_dir, opt.workdir)
    found = checkpoints.checkpoint_dirs(folder)
    if found and not opt.reuse_output_dir:
        raise HpcmemError(checkpoints.foreign_message(folder, found))


@dataclass(frozen=True)
class Submission:
    """What `submit` returns for the sbatch and dry-run backends: the backend's answer and the prepared run."""

    submitted: Submitted
    prepared: Prepared

    @property
    def job_id(self) -> str | None:
        return self.submitted.job_id

    @property
    def run_dir(self) -> str:
        return self.prepared.files.run_dir

"""`hpcmem submit <trainer> --preset P …`: estimate, refuse what will not fit, write the run folder, submit."""

from __future__ import annotations

import json
from typing import Any

import click

from hpcmem.cli.options import ENV_HELP, TRAINER_ARG, collect, env_pairs, job_from_cli, job_options, typed
from hpcmem.cli.trl_argv import TrlCommand
from hpcmem.errors import HpcmemError, SpecError
from hpcmem.inputs.files import is_file
from hpcmem.job.trl_config import read_yaml
from hpcmem.launch import LaunchOptions, load_preset, submit
from hpcmem.launch.backends import Submitit
from hpcmem.launch.presets import preset_settings
from hpcmem.plan import search
from hpcmem.plan.explain import host_lines
from hpcmem.plan.flags import flags_line


def _trl_fields(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The user's TRL YAML as written (fields hpcmem does not model travel unchanged) + --model_name_or_path."""
    fields = read_yaml(kwargs["config"]) if kwargs.get("config") else {}
    fields.update(kwargs.get("trl_flags") or {})       # --dataset_name, --output_dir … as `trl <trainer>` reads them
    if kwargs.get("model_name_or_path"):
        fields["model_name_or_path"] = kwargs["model_name_or_path"]
    for name in ("model_name_or_path", "teacher_model_name_or_path"):
        value = fields.get(name)
        if isinstance(value, str) and is_file(value):
            # the job's TRL loads it with from_pretrained (transformers modeling_utils.py), which takes a Hub id or
            # the model's folder; `hpcmem estimate` alone reads a bare config.json
            raise HpcmemError(f"{name} {value} is a file: the job loads the model from its folder (config.json and "
                              "the weights) or a Hub id; pass the folder")
    return fields


def _top_plan(job, kwargs: dict[str, Any], allow_peft: bool, preset):
    """`--plan`: the planner's fastest combination that fits the GPU and the node's host RAM; every flag the user
    gave stays fixed."""
    # --accelerate_config fixes the sharding and --lengths the batch and packing, as in `hpcmem plan`
    # (hpcmem.plan.knobs.FIXING_FLAGS); --config stands for the fields it sets
    given = set(collect(kwargs)) - {"config"}
    if kwargs.get("config"):
        given |= set(read_yaml(kwargs["config"]))
    report = search(job, job.gpu, fixed=given, allow_peft=allow_peft, top=1,
                    host_memory_per_node_bytes=preset.memory_per_node_bytes,
                    host_source=f"preset {preset.name}'s memory_per_node_gb" if preset.memory_per_node_bytes else "")
    if not report.plans:
        # one problem per line (SpecError): the CLI escapes control characters within a line, not between them
        raise SpecError([f"--plan: no combination of free knobs fits on {job.gpu.name}"
                         f"{' and in ' + preset.name + ' host RAM' if preset.memory_per_node_bytes else ''}"
                         "; see `hpcmem plan … --preset " + preset.name + " --explain`",
                         *(line.strip() for line in host_lines(report))])

    best = report.plans[0]
    click.echo(f"plan: {best.knobs.label(job.parallel.world_size == 1)}: {flags_line(job, best.job)}", err=True)
    return best.job


def _build(trainer: str, preset_ref: str, launch: dict[str, Any], kwargs: dict[str, Any], use_plan: bool = False,
           allow_peft: bool = False):
    preset = load_preset(preset_ref)
    env = env_pairs(launch.pop("env"))
    job, _ = job_from_cli(trainer, kwargs, preset=preset_settings(preset, kwargs.get("gpu")), settle_required=use_plan,
                          env={**preset.env, **env})
    if use_plan:
        job = _top_plan(job, kwargs, allow_peft, preset)
    options = LaunchOptions(env=env, trl_fields=_trl_fields(kwargs), **launch)
    return job, preset, options


def _report(done, as_json: bool, dry_run: bool, script: str | None = None) -> None:
    p = done.prepared
    if as_json:
        click.echo(json.dumps({"run_dir": done.run_dir, "job_id": done.job_id, "backend": done.submitted.backend,
                               "fits": p.fit.fits if p.fit else None,
                               "verdict": p.fit.verdict.to_json() if p.fit and p.fit.verdict else None,
                               "script": p.files.script}, indent=2))
        return
    if dry_run:
        click.echo(script if script is not None else p.contents["job.sbatch"])
    launch = p.launch
    click.echo(f"preset {launch.preset.name}: partition {launch.preset.partition}, {launch.nodes} node(s) × "
               f"{launch.gpus_per_node} {launch.preset.gpu} GPU(s) × {launch.cpus_per_task} CPUs, time {launch.time_limit.describe()}")
    if p.fit:
        click.echo(p.fit.message())
    if "processor.json" in p.contents:
        size = json.loads(p.contents["processor.json"])["size"]
        click.echo(f"images: resized into [{size['shortest_edge']:,}, {size['longest_edge']:,}] pixels as the estimate "
                   "assumed: trl_entry.py gives processor.json to AutoProcessor.from_pretrained over the checkpoint's "
                   "preprocessor_config.json")
    for warning in launch.warnings:
        click.echo(f"warning: {warning}")
    click.echo(f"run folder {done.run_dir}: " + ", ".join(sorted(p.contents)))
    if done.submitted.detail:
        click.echo(done.submitted.detail)
    if done.job_id:
        click.echo(f"submitted job {done.job_id}; follow it with: hpcmem status {done.run_dir} · hpcmem logs "
                   f"{done.run_dir}")


def _refuse_idle_flags(launch: dict[str, Any], use_plan: bool, allow_peft: bool) -> None:
    """Launch flags that act only beside another one: given alone they would be dropped without a word."""
    if allow_peft and not use_plan:
        raise HpcmemError("--allow_peft lets --plan choose LoRA/QLoRA and does nothing without it; add --plan or drop it")
    if typed("max_restarts") and not launch["requeue"]:
        raise HpcmemError(f"--max-restarts {launch['max_restarts']} counts the requeues of --requeue and does nothing "
                          "without it; add --requeue or drop it")


@click.command(name="submit", cls=TrlCommand)
@TRAINER_ARG
@job_options
@click.option("--preset", "preset_ref", required=True, help="preset NAME on the search path or a FILE (hpcmem presets list)")
@click.option("--backend", type=click.Choice(["sbatch", "submitit", "dry-run"]), default="sbatch", show_default=True)
@click.option("--dry-run", is_flag=True, help="write the run folder and print the script; submit nothing")
@click.option("--force", is_flag=True, help="submit even when the estimate says the job does not fit")
@click.option("--requeue", is_flag=True, help="before the time limit, requeue and resume from the newest checkpoint")
@click.option("--max-restarts", "--max_restarts", "max_restarts", type=click.IntRange(0, 1000), default=3,
              show_default=True)
@click.option("--time", default=None, help="SLURM time limit, as sbatch reads it: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S "
              "or UNLIMITED (0 and -1 also mean no limit); default: the preset's max_time")
@click.option("--job-name", "--job_name", "job_name", default="", help="default hpcmem-<trainer>")
@click.option("--runs-dir", "runs_dir", default="runs", show_default=True, help="where run folders are created")
@click.option("--env", "env", multiple=True, help=ENV_HELP + "; secrets: export them before submitting instead, "
              "sbatch passes your environment on and nothing is written")
@click.option("--vllm-placement", "vllm_placement", type=click.Choice(["node", "split"]), default="node",
              show_default=True, help="vllm_mode server: trl vllm-serve on its own node, or on GPUs of the one node")
@click.option("--account", default=None, help="default: the preset's")
@click.option("--qos", default=None, help="default: the preset's")
@click.option("--entry", default=None, help="training script to launch instead of `-m trl.scripts.<trainer>`")
@click.option("--reuse-output-dir", "--reuse_output_dir", "reuse_output_dir", is_flag=True,
              help="submit even when output_dir already holds another run's checkpoints (this run resumes only from "
                   "its own)")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
@click.option("--plan", "use_plan", is_flag=True, help="submit the fastest plan that fits (hpcmem plan); the flags "
              "you give stay fixed")
@click.option("--allow_peft", "--allow-peft", "allow_peft", is_flag=True, help="with --plan: LoRA/QLoRA may be chosen")
def command(trainer: str, preset_ref: str, backend: str, dry_run: bool, force: bool, runs_dir: str, as_json: bool,
            use_plan: bool, allow_peft: bool, **kwargs) -> None:
    """Submit a TRL fine-tuning job to SLURM, after checking that it fits in GPU memory.

    Flags and --config keys are TRL's field names. Writes runs/<name>-<time>/ (script, accelerate/DeepSpeed/TRL
    configs, resolved spec, estimate, job id). Example:
    hpcmem submit sft --config sft.yaml --preset mycluster-h100 --num_machines 2 --num_processes 16 --requeue
    """
    launch = {k: kwargs.pop(k) for k in ("requeue", "max_restarts", "time", "job_name", "env", "vllm_placement",
                                          "account", "qos", "entry", "reuse_output_dir")}
    _refuse_idle_flags(launch, use_plan, allow_peft)
    job, preset, options = _build(trainer, preset_ref, launch, kwargs, use_plan, allow_peft)
    if typed("vllm_placement") and not (job.train.use_vllm and job.train.vllm_mode == "server"):
        raise HpcmemError(f"--vllm-placement {launch['vllm_placement']} places a vLLM server, and this job has none "
                          "(use_vllm with vllm_mode server); drop it")
    done = submit(job, preset, options, backend="dry-run" if dry_run else backend, runs_root=runs_dir, force=force)
    if backend == "submitit" and not dry_run:
        click.echo(f"submitted job {done.job_id} through submitit")
        return
    # with --backend submitit, the dry run shows the file submitit would submit (its own #SBATCH lines and srun)
    script = Submitit().script(done.prepared) if backend == "submitit" and dry_run else None
    _report(done, as_json, dry_run, script)

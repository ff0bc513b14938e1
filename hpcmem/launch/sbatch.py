"""Pure renderer of the sbatch script: Launch + the run folder's file names → one shell script (templates/sbatch/).

The script is the only place a job's shell lives. Values enter it through `hpcmem.launch.templating`, which quotes
every one of them; the few snippets built here (`Shell`) are fixed text with `$VARIABLES` that must expand inside
each SLURM task — `$SLURM_NODEID`, `$MASTER_ADDR` — never in the batch shell (else every node starts as rank 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from hpcmem.launch.checkpoints import MARKER_PREFIX
from hpcmem.launch.container_paths import job_mounts
from hpcmem.launch.job import PORT_BASE, PORT_SPAN, Launch
from hpcmem.launch.templating import Shell, join, render


@dataclass(frozen=True, kw_only=True)
class RunFiles:
    """Absolute paths of what the run folder holds (hpcmem.launch.runfolder writes them)."""

    run_dir: str
    script: str
    accelerate_config: str
    trl_config: str
    output_dir: str
    logs_dir: str
    deepspeed_config: str | None = None
    entry_script: str | None = None     # trl_entry.py: runs the TRL script with processor.json's image bounds


@dataclass(frozen=True)
class EnvVar:
    name: str
    value: str
    why: str


def environment(launch: Launch) -> list[EnvVar]:
    """Every variable the batch shell exports, in order (later wins), each with the reason it is there."""
    env = [
        EnvVar("PYTHONUNBUFFERED", "1", "log lines reach the per-node logs as they happen (hpcmem logs tails them)"),
        EnvVar("OMP_NUM_THREADS", str(launch.omp_num_threads),
               f"cpus_per_task {launch.cpus_per_task} shared by {launch.procs_per_node} processes per node; torchrun "
               "would otherwise force 1"),
        EnvVar("SRUN_CPUS_PER_TASK", str(launch.cpus_per_task),
               "since SLURM 22.05 srun does not inherit --cpus-per-task from sbatch"),
        EnvVar("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1",
               "a failed or hung NCCL collective aborts the process, so srun --kill-on-bad-exit ends the job instead "
               "of idling until the time limit"),
    ]
    if launch.job.expandable_segments and not launch.sets_allocator:
        # the preset's or --env's allocator variable says the same (Launch._check_env): one source, not two
        why = "the estimate assumed expandable_segments (less fragmentation); "
        env += [EnvVar("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True", why + "vLLM sleep mode reads only this"),
                EnvVar("PYTORCH_ALLOC_CONF", "expandable_segments:True", why + "the name torch ≥ 2.9 reads")]
    env += [EnvVar(k, v, f"preset {launch.preset.name}") for k, v in launch.preset.env.items()]
    env += [EnvVar(k, v, "--env on the command line") for k, v in launch.options.env.items()]
    return env


def _accelerate_args(launch: Launch, files: RunFiles, *, multi_node: bool) -> list[Any]:
    par = launch.job.parallel
    args: list[Any] = ["accelerate", "launch", "--config_file", files.accelerate_config,
                       "--num_machines", par.num_machines, "--num_processes", par.world_size]
    if multi_node:
        args += ["--machine_rank", Shell('"$SLURM_NODEID"'), "--main_process_ip", Shell('"$MASTER_ADDR"'),
                 "--main_process_port", Shell('"$MASTER_PORT"'), "--rdzv_backend", "c10d",
                 # Node 0 hosts the c10d store. torchrun otherwise guesses by matching MASTER_ADDR against the
                 # machine's names (torch/distributed/elastic/rendezvous/utils.py `_matches_machine_hostname`), which
                 # misses secondary NICs (IB addresses) and, with several nodes on one host, elects all of them.
                 "--rdzv_conf", Shell('"is_host=$(( SLURM_NODEID == 0 ))"')]
    else:
        args += ["--machine_rank", 0, "--main_process_port", Shell('"$MASTER_PORT"')]
    entry = launch.options.entry
    if entry:
        args += [entry]
    elif files.entry_script:
        args += [files.entry_script, f"trl.scripts.{launch.trainer}"]
    else:
        args += ["--module", f"trl.scripts.{launch.trainer}"]
    args += ["--config", files.trl_config]
    return args


def _task(launch: Launch, files: RunFiles, *, multi_node: bool, extra: Sequence[Any] = ()) -> Shell:
    """The command one SLURM task runs; `$VARS` in it expand when the task starts, on its own node."""
    argv = join([*_accelerate_args(launch, files, multi_node=multi_node), *extra])
    resume = Shell('${HPCMEM_RESUME:+--resume_from_checkpoint "$HPCMEM_RESUME"}')
    head = 'echo "hpcmem: task $SLURM_PROCID on $(hostname) (node $SLURM_NODEID of $SLURM_NNODES)"'
    return Shell(f"{head}; exec {argv} {resume}")


def _srun(launch: Launch, files: RunFiles, nodes: int, log: str, extra: Sequence[Any] = ()) -> Shell:
    args: list[Any] = ["srun", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1",
                       "--kill-on-bad-exit=1", "--wait=60", f"--output={filename_pattern(files.logs_dir)}/{log}",
                       f"--error={filename_pattern(files.logs_dir)}/{log}", "--open-mode=append", *extra]
    container = launch.preset.container
    if container is not None and container.kind == "pyxis":
        args.append(f"--container-image={container.image}")
        args.append(f"--container-mounts={','.join(job_mounts(container.mounts, launch.run_dir))}")
        args += list(container.options)
    return join(args)


def _wrap_argv(launch: Launch, body: Shell) -> list[Any]:
    """argv of `bash -c BODY`, inside apptainer when the preset says so."""
    container = launch.preset.container
    prefix: list[Any] = []
    if container is not None and container.kind == "apptainer":
        prefix = ["apptainer", "exec", "--nv", *[f"--bind={m}" for m in job_mounts(container.mounts, launch.run_dir)],
                  *container.options, container.image]
    return [*prefix, "bash", "-c", str(body)]


def _wrap(launch: Launch, body: Shell) -> Shell:
    """`bash -c BODY` as shell text; BODY is quoted as one argument, so its $VARS expand in the task."""
    return join(_wrap_argv(launch, body))


def task_argv(launch: Launch, files: RunFiles) -> list[str]:
    """The per-node launcher as an argv (what the submitit backend runs in each task)."""
    return [str(a) for a in _wrap_argv(launch, _task(launch, files, multi_node=launch.train_nodes > 1))]


def allocation(launch: Launch) -> dict[str, Any]:
    """The sbatch options for GPUs, memory and accounting (shared with the submitit backend)."""
    opt = launch.options
    out = preset_allocation(launch.preset, launch.gpus_per_node, account=opt.account, qos=opt.qos)
    if opt.workdir:
        out["chdir"] = opt.workdir
    return out


def preset_allocation(pre: Any, gpus_per_node: int, *, account: str | None = None, qos: str | None = None,
                      memory_gb: int | None = None) -> dict[str, Any]:
    """GPUs (the preset's gres or gpus-per-node form; none when 0), memory (`memory_gb`, else the preset's per node)
    and accounting, as sbatch options; shared by jobs and calibration campaigns (hpcmem.calibrate.scripts)."""
    out: dict[str, Any] = {}
    if gpus_per_node:
        gpus = f"{pre.gres_type}:{gpus_per_node}" if pre.gres_type else gpus_per_node
        out = {"gres": f"gpu:{gpus}"} if pre.gpu_request == "gres" else {"gpus-per-node": gpus}
    memory = memory_gb or pre.memory_per_node_gb
    if memory:
        out["mem"] = f"{memory}G"
    for key, value in (("account", account or pre.account), ("qos", qos or pre.qos), ("constraint", pre.constraint)):
        if value:
            out[key] = value
    return out


def sbatch_directives(launch: Launch, files: RunFiles) -> list[tuple[str, Any]]:
    """(option, value) pairs for `#SBATCH --option=value`; value None → a bare flag. Sorted by option."""
    d: dict[str, Any] = {
        "job-name": launch.job_name, "partition": launch.preset.partition, "nodes": launch.nodes,
        "ntasks-per-node": 1, "cpus-per-task": launch.cpus_per_task, "time": launch.time,
        "output": f"{filename_pattern(files.logs_dir)}/batch-%j.log", "open-mode": "append", **allocation(launch),
    }
    if launch.options.requeue:
        d["requeue"] = None
        d["signal"] = f"B:USR1@{launch.preset.signal_lead_s}"
    else:
        d["no-requeue"] = None
    return sorted(d.items())


def filename_pattern(path: str) -> str:
    """A path as a SLURM filename pattern: a literal % is written %% (sbatch(1) "filename pattern")."""
    return path.replace("%", "%%")


def template_context(launch: Launch, files: RunFiles) -> dict[str, Any]:
    """What every sbatch template (and submitit's setup lines) is rendered with."""
    return {
        "launch": launch, "files": files, "directives": sbatch_directives(launch, files),
        "env": environment(launch), "port_base": PORT_BASE, "port_span": PORT_SPAN,
        "modules": launch.preset.modules, "setup": [Shell(s) for s in launch.preset.setup],
        "requeue": launch.options.requeue, "max_restarts": launch.options.max_restarts,
        "signal_lead_s": launch.preset.signal_lead_s, "marker_prefix": MARKER_PREFIX,
    }


def render_sbatch(launch: Launch, files: RunFiles) -> str:
    """The whole sbatch script for `launch` (template chosen by Launch.template)."""
    launch.check()
    context = template_context(launch, files)
    if launch.vllm_server:
        context.update(_vllm_context(launch, files))
    else:
        body = _task(launch, files, multi_node=launch.train_nodes > 1)
        context["train_step"] = Shell(f"{_srun(launch, files, launch.train_nodes, 'node%n.log')} {_wrap(launch, body)}")
    return render(launch.template, **context)


def _vllm_context(launch: Launch, files: RunFiles) -> dict[str, Any]:
    """GRPO/RLOO with `vllm_mode: server`: `trl vllm-serve` on its own node or on a GPU subset of the one node.

    The trainer gets the server's host as `--vllm_server_host` (GRPOConfig/RLOOConfig field; TRL's multi-node doc
    example passes `--server_ip`, which the script does not read) and job-derived ports for the server and for the
    weight-sync group, so that two jobs on one node do not collide.
    """
    t = launch.job.train
    model = launch.options.trl_fields.get("model_name_or_path", "")
    connect = ["--vllm_server_host", Shell('"$VLLM_ADDR"'), "--vllm_server_port", Shell('"$VLLM_PORT"'),
               "--vllm_group_port", Shell('"$VLLM_GROUP_PORT"')]
    serve = ["trl", "vllm-serve", "--model", model, "--tensor_parallel_size", t.vllm_tensor_parallel_size,
             "--host", "0.0.0.0", "--port", Shell('"$VLLM_PORT"')]
    split = launch.options.vllm_placement == "split"
    if split:
        serve_body = Shell(f'export CUDA_VISIBLE_DEVICES="$VLLM_GPUS"; exec {join(serve)}')
        train_body = _task(launch, files, multi_node=False, extra=connect)
        train_body = Shell(f'export CUDA_VISIBLE_DEVICES="$TRAIN_GPUS"; {train_body}')
        serve_step = _srun(launch, files, 1, "vllm.log", ["--overlap"])
        train_step = _srun(launch, files, 1, "node%n.log", ["--overlap"])
    else:
        dp = max(1, launch.gpus_per_node // t.vllm_tensor_parallel_size)
        serve_body = Shell(f"exec {join([*serve, '--data_parallel_size', dp])}")
        train_body = _task(launch, files, multi_node=launch.train_nodes > 1, extra=connect)
        serve_step = _srun(launch, files, 1, "vllm.log", [Shell('--nodelist="$VLLM_NODE"')])
        train_step = _srun(launch, files, launch.train_nodes, "node%n.log", [Shell('--exclude="$VLLM_NODE"')])
    return {
        "vllm_split": split, "vllm_gpus": launch.vllm_gpus,
        "serve_step": Shell(f"{serve_step} {_wrap(launch, serve_body)}"),
        "train_step": Shell(f"{train_step} {_wrap(launch, train_body)}"),
    }

"""The submitit backend's parameters: the same allocation, environment and per-node launcher as the sbatch script.

submitit writes its own sbatch file (sorted `#SBATCH` lines, `slurm_setup` lines, then `srun … python -m
submitit.core._submit`); hpcmem gives it the rendered setup section of templates/sbatch/setup.sh.j2 and, as the
function each task calls, the per-node `bash -c` launcher — so `$SLURM_NODEID` still expands inside each task.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hpcmem.errors import HpcmemError
from hpcmem.launch.sbatch import task_argv as _task_argv, template_context
from hpcmem.launch.templating import render

if TYPE_CHECKING:
    from hpcmem.launch.submission import Prepared


def executor_parameters(prepared: Prepared, cluster: str) -> dict[str, Any]:
    launch = prepared.launch
    if launch.vllm_server:
        raise HpcmemError("the submitit backend runs one launcher per node; vllm_mode server needs the sbatch backend")
    pre = launch.preset
    params: dict[str, Any] = {"name": launch.job_name, "timeout_min": launch.time_min, "nodes": launch.nodes,
                              "tasks_per_node": 1, "cpus_per_task": launch.cpus_per_task}
    if cluster != "slurm":
        return params
    gpus = launch.gpus_per_node
    extra: dict[str, Any] = {"chdir": launch.options.workdir}
    if pre.gpu_request == "gres":
        extra["gres"] = f"gpu:{pre.gres_type}:{gpus}" if pre.gres_type else f"gpu:{gpus}"
    else:
        extra["gpus-per-node"] = f"{pre.gres_type}:{gpus}" if pre.gres_type else gpus
    params.update(
        slurm_partition=pre.partition,
        slurm_setup=[render("sbatch/setup.sh.j2", **template_context(launch, prepared.files))],
        slurm_srun_args=["--kill-on-bad-exit=1", "--wait=60"],
        slurm_additional_parameters=extra,
    )
    for key, value in (("slurm_account", launch.options.account or pre.account),
                       ("slurm_qos", launch.options.qos or pre.qos), ("slurm_constraint", pre.constraint)):
        if value:
            params[key] = value
    if pre.memory_per_node_gb:
        params["mem_gb"] = pre.memory_per_node_gb
    return params


def task_argv(prepared: Prepared) -> list[str]:
    return _task_argv(prepared.launch, prepared.files)

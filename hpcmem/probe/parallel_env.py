"""Probe runs under a parallelism config: the environment accelerate's launcher would hand the training processes.

The variables come from accelerate's own code (utils/launch.py `prepare_extend_env_parallelism_config`) applied to the
`parallelism_config` block hpcmem writes into the accelerate YAML (hpcmem.job.parallelism), after accelerate's
launcher has copied the block onto its arguments as it does for a config file (commands/launch.py
`_validate_launch_command`) — so a probe runs the layout a submitted job would get, or fails the same way.
"""

from __future__ import annotations

from typing import Any

from hpcmem.job.parallelism import parallelism_block


def parallelism_env(job: Any) -> dict[str, str]:
    """PARALLELISM_CONFIG_* and ACCELERATE_USE_PARALLELISM_CONFIG for the job's layout ({} without one)."""
    block = parallelism_block(job.parallel)
    if not block:
        return {}
    from accelerate.commands.launch import launch_command_parser
    from accelerate.utils.launch import prepare_extend_env_parallelism_config

    args = launch_command_parser().parse_args(["x.py"])        # accelerate's defaults for every argument
    for key, value in block.items():
        setattr(args, key, value)
    args.use_parallelism_config = True
    return prepare_extend_env_parallelism_config(args, {})


def needs_cpu_fsdp_mesh(job: Any, device: str) -> bool:
    """An FSDP2 layout probed on CPU: accelerate's state is MULTI_CPU while the Accelerator is built, which its
    ParallelismConfig refuses (parallelism_config.py `_validate_accelerator`); the mesh is attached once the probe
    has switched the state to FSDP (hpcmem.probe.trainers.enable_fsdp_on_cpu)."""
    return device == "cpu" and job.parallel.fsdp and job.parallel.layout.active


def attach_parallelism_on_cpu(trainer: Any, job: Any) -> None:
    """The ParallelismConfig accelerate would build from the launcher's environment, with its device mesh on CPU,
    validated by accelerate against the FSDP state — what `Accelerator.__init__` does on a GPU."""
    from accelerate import ParallelismConfig
    from accelerate.utils import patch_environment

    with patch_environment(**parallelism_env(job)):
        pc = ParallelismConfig()
    if pc.cp_enabled:
        from hpcmem.probe.cpu_ring import enable  # deferred: imports torch at module level (calibrate plans without it)

        enable()                # torch's ring attention around the CPU flash kernel
    acc = trainer.accelerator
    acc.state.parallelism_config = pc
    acc.state.device_mesh = pc.get_device_mesh("cpu")
    pc._validate_accelerator(acc)

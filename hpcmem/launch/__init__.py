"""Launch TRL jobs on SLURM: admin presets, pure renderers (accelerate, DeepSpeed, FSDP, TRL YAML, sbatch), the run
folder and the backends (dry-run, sbatch, submitit). `submit(job, preset, options)` is the Python entry point."""

from hpcmem.launch.job import Launch, LaunchOptions
from hpcmem.launch.presets import Preset, load as load_preset
from hpcmem.launch.submission import DoesNotFit, Prepared, Submission, prepare, submit

__all__ = ["DoesNotFit", "Launch", "LaunchOptions", "Prepared", "Preset", "Submission", "load_preset", "prepare",
           "submit"]

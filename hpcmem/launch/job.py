"""A launch = one JobSpec + the site's Preset + the choices that only matter to SLURM (LaunchOptions).

`Launch` derives the allocation (nodes, GPUs per node, the vLLM server's place) and checks it against the preset,
gathering every problem with its numbers before anything is written or submitted.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Mapping

from hpcmem.errors import Problems, SpecError
from hpcmem.inputs.values import InputError, shown, text
from hpcmem.job.images import LOADING_NOTES, pixel_bounds, processor_kwargs
from hpcmem.job.job_env import ALLOC_VARS, read_env
from hpcmem.job.trainers import entry
from hpcmem.launch import slurm_time
from hpcmem.launch.container_paths import invisible, job_mounts, needed_paths, unmountable
from hpcmem.launch.presets import ENV_NAME, Preset
from hpcmem.launch.slurm_time import TimeLimit

if TYPE_CHECKING:
    from hpcmem.job.jobspec import JobSpec

VLLM_PLACEMENTS = ("node", "split")
# Ports derived from the job id, so that two jobs sharing a node never collide (and a requeued job keeps its ports).
PORT_BASE, PORT_SPAN = 20000, 10000


@dataclass(frozen=True, kw_only=True)
class LaunchOptions:
    """SLURM-side choices of one submission (hpcmem-only names; TRL fields live in the spec and `trl_fields`)."""

    job_name: str = ""                          # "" → hpcmem-<trainer>
    time: str | None = None                     # SLURM time format; None → the preset's max_time
    requeue: bool = False                       # trap B:USR1 before the limit, requeue, resume from a checkpoint
    max_restarts: int = 3                       # requeues hpcmem asks for before it lets the job end
    vllm_placement: str = "node"                # vllm_mode=server: "node" (one extra node) or "split" (GPUs of one)
    account: str | None = None                  # None → the preset's
    qos: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)          # extra variables (--env NAME=VALUE)
    trl_fields: Mapping[str, Any] = field(default_factory=dict)   # the user's TRL YAML (model, dataset, output_dir…)
    entry: str | None = None                    # training script; None → `--module trl.scripts.<trainer>`
    cpus_per_task: int | None = None            # None → the preset's cpus_per_node
    workdir: str = ""                           # sbatch --chdir ("" → the submitting directory): relative paths
                                                # of the TRL YAML (dataset, output_dir) resolve here
    reuse_output_dir: bool = False              # submit even when output_dir holds another run's checkpoints


def default_job_name(options: LaunchOptions, trainer: str) -> str:
    return options.job_name or f"hpcmem-{trainer}"


@dataclass(frozen=True, kw_only=True)
class Launch:
    job: JobSpec
    preset: Preset
    options: LaunchOptions
    run_dir: str                                # absolute; the run folder the script writes logs into

    @property
    def trainer(self) -> str:
        return self.job.train.trainer

    @property
    def job_name(self) -> str:
        return default_job_name(self.options, self.trainer)

    @property
    def use_cpu(self) -> bool:
        return bool(self.options.trl_fields.get("use_cpu"))

    @property
    def vllm_server(self) -> bool:
        t = self.job.train
        return entry(t.trainer).generates and t.use_vllm and t.vllm_mode == "server"

    @property
    def vllm_gpus(self) -> int:
        return self.job.train.vllm_tensor_parallel_size if self.vllm_server else 0

    @property
    def train_nodes(self) -> int:
        return self.job.parallel.num_machines

    @property
    def procs_per_node(self) -> int:
        return self.job.parallel.gpus_per_machine

    @property
    def nodes(self) -> int:
        extra = 1 if self.vllm_server and self.options.vllm_placement == "node" else 0
        return self.train_nodes + extra

    @property
    def gpus_per_node(self) -> int:
        """GPUs asked for on every node (SLURM gives each node of one job the same count)."""
        if not self.vllm_server:
            return self.procs_per_node
        if self.options.vllm_placement == "split":
            return self.procs_per_node + self.vllm_gpus
        return max(self.procs_per_node, self.vllm_gpus)

    @property
    def cpus_per_task(self) -> int:
        return self.options.cpus_per_task or self.preset.cpus_per_node

    @property
    def omp_num_threads(self) -> int:
        return max(1, self.cpus_per_task // max(1, self.procs_per_node))

    @property
    def time_limit(self) -> TimeLimit:
        """The job's limit as SLURM reads it: --time, else the preset's max_time (ValueError when not a SLURM time)."""
        return slurm_time.parse(self.options.time) if self.options.time is not None else self.preset.max_time_limit

    @property
    def time(self) -> str:
        """The text of `#SBATCH --time`, exactly as given."""
        return self.time_limit.text

    @property
    def time_min(self) -> int | None:
        """Minutes of the limit, None for no limit."""
        return self.time_limit.minutes

    @property
    def template(self) -> str:
        if self.vllm_server:
            return "sbatch/vllm.sh.j2"
        return "sbatch/multi.sh.j2" if self.train_nodes > 1 else "sbatch/single.sh.j2"

    @cached_property
    def allocation_problems(self) -> list[str]:
        """GPUs per node and nodes the preset's partition cannot give (what `hpcmem plan --preset` checks too)."""
        p = Problems()
        pre = self.preset
        p.check(self.gpus_per_node <= pre.gpus_per_node,
                f"{self.gpus_per_node} GPUs per node requested ({self._gpu_story()}), but {pre.name} nodes have "
                f"{pre.gpus_per_node}: lower num_processes or raise num_machines")
        if pre.max_nodes:
            p.check(self.nodes <= pre.max_nodes, f"{self.nodes} nodes requested; {pre.name} allows {pre.max_nodes}")
        return p.items

    @cached_property
    def problems(self) -> list[str]:
        """Everything that makes this launch impossible on the preset's partition, each with its numbers."""
        p = Problems()
        pre, opt = self.preset, self.options
        p.items.extend(self.allocation_problems)
        p.check(self.cpus_per_task <= pre.cpus_per_node,
                f"cpus_per_task {self.cpus_per_task} exceeds {pre.name}'s {pre.cpus_per_node} CPUs per node")
        self._check_time(p)
        if opt.requeue:
            p.check(opt.max_restarts >= 1, f"max_restarts must be ≥ 1 with requeue, got {opt.max_restarts}")
        p.check(opt.vllm_placement in VLLM_PLACEMENTS,
                f"vllm_placement must be one of {', '.join(VLLM_PLACEMENTS)}, got {opt.vllm_placement!r}")
        if self.vllm_server and opt.vllm_placement == "split":
            p.check(self.train_nodes == 1, "vllm_placement split shares one node; with num_machines "
                    f"{self.train_nodes} use vllm_placement node")
        if self.vllm_server:
            p.check(bool(opt.trl_fields.get("model_name_or_path")),
                    "vllm_mode server needs model_name_or_path in the TRL YAML (trl vllm-serve serves it)")
        for name in ("account", "qos"):
            # `opt.x or preset.x` would read an empty --account/--qos as "the preset's" without a word
            p.check(getattr(opt, name) != "", f"--{name} '' is empty: give a SLURM {name}, or leave the flag out for "
                    f"the preset's ({getattr(pre, name) or 'none'})")
        output_dir = opt.trl_fields.get("output_dir")
        # run_files places the resume marker in <run>/output for an empty output_dir, while TRL saves its
        # checkpoints relative to the job's working folder: the requeue would never find them
        p.check(output_dir is None or str(output_dir).strip() != "",
                f"output_dir {output_dir!r} is empty or blank: TRL would save checkpoints into the job's working folder "
                f"({opt.workdir}) while a requeue resumes from the run folder's output/; name a folder, or leave "
                "output_dir out for the run folder's output/")
        self._check_script_values(p)
        self._check_container_paths(p)
        self._check_env(p)
        return p.items

    @property
    def env(self) -> dict[str, str]:
        """The variables the preset and --env export in the job (later wins)."""
        return {**self.preset.env, **self.options.env}

    @property
    def sets_allocator(self) -> bool:
        """Whether the preset or --env sets the caching allocator's variables (then hpcmem exports none of its own)."""
        return any(name in self.env for name in ALLOC_VARS)

    def _check_env(self, p: Problems) -> None:
        """The job was estimated with the environment it runs with (hpcmem.job.job_env): the CLI builds it so; a
        job built without it would be estimated for another run."""
        try:
            ran = read_env(self.env, "the preset's env and --env")
        except SpecError as exc:
            p.items.extend(exc.problems)
            return
        if ran != self.job.env:
            p.add("the job was estimated without the environment it runs with (the preset's env and --env): "
                  "build it with that environment (hpcmem.cli.options.job_from_cli env=)")
        elif ran.allocator_value is not None and bool(ran.expandable) != self.job.expandable_segments:
            p.add(f"expandable_segments {self.job.expandable_segments} disagrees with the allocator setting "
                  f"{ran.allocator_value!r} of the preset's env and --env")

    def _check_container_paths(self, p: Problems) -> None:
        """Every path the job reads or writes is visible inside the preset's container
        (hpcmem.launch.container_paths)."""
        container = self.preset.container
        if container is None:
            return
        workdir = self.options.workdir or os.getcwd()
        env = {**self.preset.env, **self.options.env}
        why = unmountable(self.run_dir)
        if why:
            p.add(why)
            return
        needed = needed_paths(self.run_dir, workdir, self.options.trl_fields, env)
        p.items.extend(invisible(container.kind, job_mounts(container.mounts, self.run_dir), needed, workdir=workdir,
                                 home=os.environ.get("HOME")))

    @property
    def warnings(self) -> list[str]:
        """What will run but not as the user probably hopes."""
        out: list[str] = []
        fields = self.options.trl_fields
        if self.options.requeue and str(fields.get("save_strategy", "steps")).lower() == "no":
            out.append("--requeue resumes from checkpoints, but save_strategy is 'no': a restart begins at step 0")
        if self.options.requeue and not self.problems and self.time_limit.unlimited:
            out.append(f"--requeue acts at signal_lead_s before the time limit, but time {self.time} is no limit: "
                       "the job is never requeued")
        t = self.job.train
        if self.options.entry and processor_kwargs(t, self.job.model.vision):
            lo, hi = pixel_bounds(t, self.job.model.vision)
            out.append(f"--entry {self.options.entry} builds its own processor: the estimate assumed images resized "
                       f"into [{lo:,}, {hi:,}] pixels (min_pixels, max_pixels); pass the same to "
                       "AutoProcessor.from_pretrained there")
        v = self.job.model.vision
        if v is not None and t.images_per_example and v.model_type in LOADING_NOTES and not self.options.entry:
            out.append(f"{LOADING_NOTES[v.model_type]}; trl.scripts.{t.trainer} loads the checkpoint's own class and "
                       "processor: give --entry a script that loads these")
        if self.options.requeue and fields.get("save_only_model"):
            out.append("save_only_model: true keeps no optimizer/scheduler/RNG state, which \"prevents resuming "
                       "training from the checkpoint\" (transformers TrainingArguments); a restart cannot resume")
        return out

    def sbatch_texts(self) -> dict[str, Any]:
        """Every text value that becomes part of an `#SBATCH` line, by the name the user knows it by."""
        pre, opt = self.preset, self.options
        return {"job name": self.job_name, "partition": pre.partition, "account": opt.account or pre.account,
                "qos": opt.qos or pre.qos, "constraint": pre.constraint, "gres_type": pre.gres_type,
                "run folder": self.run_dir, "workdir": opt.workdir}

    def script_words(self) -> dict[str, Any]:
        """Text values that reach the script as quoted shell words (any character but NUL)."""
        fields = self.options.trl_fields
        words = {"entry": self.options.entry, "output_dir": fields.get("output_dir"),
                 "model_name_or_path": fields.get("model_name_or_path") if self.vllm_server else None}
        words.update({f"--env {k}": value for k, value in self.options.env.items()})
        return words

    def _check_script_values(self, p: Problems) -> None:
        """sbatch's directive parser ends a value at its line's end (src/sbatch/opt.c `get_argument`), so an
        #SBATCH value holds no control character; a shell word holds no NUL (no argv can)."""
        for what, value in self.sbatch_texts().items():
            if value is not None:
                try:
                    text(what, value, max_len=4096)
                except InputError as exc:
                    p.add(f"{exc.problems[0]}: no #SBATCH line can carry it")
        for what, value in self.script_words().items():
            if value is not None:
                p.check(isinstance(value, str) and "\x00" not in value,
                        f"{what} must be text without a NUL character; got {shown(value)}")
        # SLURM filename patterns (--output) drop every backslash and then expand no %j (sbatch(1)).
        p.check("\\" not in self.run_dir, f"run folder {self.run_dir!r} contains a backslash, which SLURM removes "
                "from --output paths; choose another --runs-dir")
        for name in self.options.env:
            p.check(bool(ENV_NAME.fullmatch(name)), f"--env name {shown(name)} is not a shell variable name "
                    "([A-Za-z_][A-Za-z0-9_]*)")

    def _check_time(self, p: Problems) -> None:
        try:
            cap = self.preset.max_time_limit
            limit = self.time_limit
        except ValueError as exc:
            p.add(f"{'--time' if self.options.time is not None else f'preset {self.preset.name} max_time'}: {exc}")
            return
        p.check(limit.fits_within(cap), f"time {limit.describe()} exceeds {self.preset.name}'s max_time "
                f"{cap.describe()}" + (" (SLURM reads 0 and -1 as no limit)" if limit.unlimited else ""))
        if self.options.requeue and limit.minutes is None:
            # sbatch --signal=B:USR1@lead fires lead seconds before the job's end time; a job without a time limit
            # has none, so the requeue would never come (sbatch(1), --signal)
            p.add(f"--requeue acts signal_lead_s {self.preset.signal_lead_s} s before the time limit, and time "
                  f"{limit.describe()} has none: give --time, or drop --requeue")
        if self.options.requeue and limit.minutes is not None:
            p.check(self.preset.signal_lead_s < limit.minutes * 60,
                    f"signal_lead_s {self.preset.signal_lead_s} s must be shorter than the time limit "
                    f"{limit.describe()}")

    def _gpu_story(self) -> str:
        story = f"{self.procs_per_node} training processes per node"
        if self.vllm_server:
            story += f", vLLM tensor_parallel_size {self.vllm_gpus} ({self.options.vllm_placement})"
        return story

    def check(self) -> None:
        if self.problems:
            raise SpecError(self.problems)

"""`hpcmem plan <trainer> …`: the fastest combination of memory techniques that fits, and why."""

from __future__ import annotations

import json

import click

from hpcmem import launch
from hpcmem.cli.options import ENV_HELP, TRAINER_ARG, collect, env_pairs, job_from_cli, job_options
from hpcmem.cli.outputs import PNG
from hpcmem.cli.trl_argv import TrlCommand
from hpcmem.errors import HpcmemError, SpecError
from hpcmem.inputs import MAX_COUNT
from hpcmem.job.trl_config import PLANNER_SETTLES, read_yaml
from hpcmem.models.coverage import required_settings
from hpcmem.plan import search
from hpcmem.plan.explain import render
from hpcmem.plan.host_ram import host_ram, parse_host_ram
from hpcmem.plan.plan_json import to_json
from hpcmem.plan.ranking import parse_headroom
from hpcmem.plots.plan_plot import draw


@click.command(name="plan", cls=TrlCommand)
@TRAINER_ARG
@job_options
@click.option("--global_batch_size", "--global-batch-size", "global_batch_size", type=click.IntRange(1, MAX_COUNT),
              default=None,
              help="samples per optimizer step, kept while batch × accumulation vary "
                   "(default per_device_train_batch_size × gradient_accumulation_steps × num_processes)")
@click.option("--allow_peft", "--allow-peft", "allow_peft", is_flag=True, help="also try LoRA and QLoRA")
@click.option("--allow_optim", "--allow-optim", "allow_optim", is_flag=True,
              help="also try bitsandbytes' 8-bit AdamW (optim adamw_8bit): it changes the update's numerics")
@click.option("--top", type=click.IntRange(1, 1000), default=10, show_default=True, help="plans to show")
@click.option("--explain", is_flag=True, help="reasons for every plan and the faster combinations that lost")
@click.option("--preset", "preset_ref", default=None, help="plan for a cluster preset (hpcmem presets list): its GPU "
              "and defaults, and plans whose host RAM per node exceeds its memory_per_node_gb are refused")
@click.option("--host_ram_per_node", "--host-ram-per-node", "host_ram_gib", default=None,
              callback=lambda ctx, param, v: None if v is None else _usage(parse_host_ram, v, param),
              help="host RAM of one node in GiB: plans needing more are not offered (default: the preset's "
                   "memory_per_node_gb, else the GPU catalog's reference node, stated as an assumption)")
@click.option("--headroom", "headroom", default=None,
              callback=lambda ctx, param, v: None if v is None else _usage(parse_headroom, v, param),
              help="least free GPU memory a plan must leave above its safe bound: GiB (4) or % of capacity (10%%)")
@click.option("--plot", "plot_path", type=PNG, default=None,
              help="also draw the searched combinations (speed vs safe device peak) as a PNG (needs matplotlib)")
@click.option("--env", "env", multiple=True, help=ENV_HELP)
@click.option("--json", "as_json", is_flag=True, help="print one JSON object instead of a table")
def command(trainer: str, global_batch_size: int | None, allow_peft: bool, top: int, explain: bool, as_json: bool,
            preset_ref: str | None, plot_path: str | None, host_ram_gib: float | None, headroom, allow_optim: bool,
            env: tuple[str, ...], **kwargs) -> None:
    """Search gradient checkpointing, activation offloading, packing, batch × accumulation, ZeRO / FSDP and
    offload, the load dtype (and LoRA/QLoRA with --allow_peft, 8-bit AdamW with --allow_optim) for the fastest setup
    that fits --gpu and the node's host RAM. A flag you give is fixed.

    Example: hpcmem plan sft --model_name_or_path meta-llama/Llama-3.1-8B --gpu H100-80GB --num_processes 8
    """
    preset = launch.load_preset(preset_ref) if preset_ref else None
    job, _ = job_from_cli(trainer, kwargs, preset=launch.preset_settings(preset, kwargs.get("gpu")) if preset else None,
                          settle_required=True, env={**(preset.env if preset else {}), **env_pairs(env)})
    if job.gpu is None:         # --gpu, the --config YAML's `gpu:` or the preset's
        raise HpcmemError("hpcmem plan needs --gpu (see `hpcmem gpus`), a `gpu:` in --config or --preset (see "
                          "`hpcmem presets list`)")
    if preset is not None:
        _check_allocation(job, preset)
    fixed = set(collect(kwargs)) | (set(read_yaml(kwargs["config"])) if kwargs.get("config") else set())
    settled = settled_note(job, fixed)
    if settled:
        click.echo(f"note: {settled}", err=True)
    host = host_ram(job.gpu.name, job.parallel.gpus_per_machine, flag_gib=host_ram_gib,
                    preset_bytes=preset.memory_per_node_bytes if preset else None,
                    preset_name=preset.name if preset else "")
    report = search(job, job.gpu, fixed=fixed, global_batch_size=global_batch_size, allow_peft=allow_peft, top=top,
                    host_memory_per_node_bytes=host.bytes, host_source=host.source, headroom=headroom,
                    allow_optim=allow_optim)
    picture = _plot(report, plot_path) if plot_path else None
    if as_json:
        click.echo(json.dumps({**to_json(report), **({"plot": picture} if picture else {}),
                               **({"settled": settled} if settled else {})}, indent=2))
        return
    click.echo(render(report, explain=explain))
    if picture:
        click.echo(f"plot: {picture}")


def _usage(parse, value: str, param: click.Parameter):     # noqa: ARG001 - click's callback signature
    """A flag's parser's one-line refusal as click's usage error (exit 2, `--json` untouched: nothing is printed)."""
    try:
        return parse(value)
    except SpecError as exc:
        raise click.UsageError(exc.problems[0]) from None


def _check_allocation(job, preset) -> None:
    """The preset's nodes hold so many GPUs, and its partition so many nodes: a layout `hpcmem submit` would refuse
    (hpcmem.launch.job.Launch.allocation_problems) is refused before planning for it."""
    problems = launch.Launch(job=job, preset=preset, options=launch.LaunchOptions(), run_dir="").allocation_problems
    if problems:
        raise SpecError(problems)


def settled_note(job, fixed: set[str]) -> str | None:
    """What the plan's start took from the model type's requirements (build_job settle_required), for the user."""
    taken = {k: v for k, v in required_settings(job.model.model_type).items() if k in PLANNER_SETTLES and k not in fixed}
    if not taken:
        return None
    said = ", ".join(f"{k} {json.dumps(v)}" for k, v in taken.items())
    return (f"model_type {job.model.model_type!r} trains only with {said} (`hpcmem models coverage --json` says why): "
            "every plan keeps it")


def _plot(report, path: str) -> str:
    return str(draw(report, path))

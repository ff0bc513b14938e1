"""`hpcmem estimate <trainer> …`: per-GPU memory of a TRL job, before it burns GPU hours."""

from __future__ import annotations

import json

import click

from hpcmem import launch
from hpcmem.cli.options import ENV_HELP, TRAINER_ARG, env_pairs, job_from_cli, job_options
from hpcmem.cli.outputs import PNG
from hpcmem.cli.trl_argv import TrlCommand
from hpcmem.estimate import estimate
from hpcmem.estimate.names import Level
from hpcmem.estimate.table import render
from hpcmem.plots.estimate_plot import draw

# `--check`'s exit statuses (README: exit statuses); 2 stays bad input, 70 a bug in hpcmem
CHECK_STATUS = {Level.TIGHT: 3, Level.DOES_NOT_FIT: 4}


@click.command(name="estimate", cls=TrlCommand)
@TRAINER_ARG
@job_options
@click.option("--preset", "preset_ref", default=None, help="a site preset (hpcmem presets list): its GPU and defaults "
              "apply, as `hpcmem submit --preset` would run the job (--gpu still overrides the GPU)")
@click.option("--env", "env", multiple=True, help=ENV_HELP)
@click.option("--plot", "plot_path", type=PNG, default=None,
              help="also draw the phases as stacked bars with capacity and safe bound, as a PNG (needs matplotlib)")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object (stable contract) instead of a table")
@click.option("--check", is_flag=True, help="exit 0 only when the job fits the GPU: 3 when it is tight (the point "
              "estimate fits, the safe bound does not), 4 when it does not fit (needs --gpu or --preset)")
def command(trainer: str, plot_path: str | None, as_json: bool, preset_ref: str | None, check: bool,
            env: tuple[str, ...], **kwargs) -> None:
    """Estimate peak allocated / reserved / device memory per GPU for a TRL trainer.

    Flags and --config keys are TRL's own field names (SFTConfig, DPOConfig, GRPOConfig, ModelConfig …).
    Example: hpcmem estimate sft --model_name_or_path Qwen/Qwen2.5-7B --use_peft --gpu H100-80GB
    """
    preset, job_env = None, env_pairs(env)
    if preset_ref:
        found = launch.load_preset(preset_ref)
        preset = {**found.defaults, "gpu": found.gpu}
        job_env = {**found.env, **job_env}
    job, ignored = job_from_cli(trainer, kwargs, preset=preset, env=job_env)
    if check and job.gpu is None:
        raise click.UsageError("--check judges the job against a GPU: give --gpu or --preset")
    est = estimate(job)
    picture = _plot(est, plot_path, job.parallel.world_size) if plot_path else None
    if as_json:
        click.echo(json.dumps({**est.to_json(), "ignored_settings": ignored,
                               **({"plot": picture} if picture else {})}, indent=2))
    else:
        click.echo(render(est))
        if ignored:
            click.echo("ignored (no memory effect modelled): " + ", ".join(ignored))
        if picture:
            click.echo(f"plot: {picture}")
    if check and est.verdict is not None and est.verdict.level != Level.FITS:
        raise click.exceptions.Exit(CHECK_STATUS[est.verdict.level])


def _plot(est, path: str, world_size: int) -> str:
    return str(draw(est, path, world_size=world_size))

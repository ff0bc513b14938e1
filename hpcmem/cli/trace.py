"""`hpcmem trace <trainer> …`: trace two real TRL training steps on fake tensors (no GPU) and print the peak."""

from __future__ import annotations

import json

import click

from hpcmem.cli.options import TRAINER_ARG, job_from_cli, job_options


@click.command(name="trace")
@TRAINER_ARG
@job_options
@click.option("--kernels", type=click.Choice(["cuda", "cpu"]), default="cuda", show_default=True,
              help="cuda: map the CPU trace to what a CUDA GPU allocates (flash attention, Triton LM head, 512-B "
                   "blocks); cpu: what a CPU run allocates (the self-check's reference)")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object (the estimate JSON contract)")
def command(trainer: str, kernels: str, as_json: bool, **kwargs) -> None:
    """Trace one GPU's peak allocated memory by running TRL's own trainer (SFT, DPO, Reward) on a fake, full-size model.

    Takes the same flags as `hpcmem estimate` (TRL field names). Needs the [train] extra (torch, transformers,
    trl, peft); runs on a login node in seconds to a minute, no GPU. Multi-GPU layouts: trace the single-GPU job,
    `hpcmem estimate` shards it.
    Example: hpcmem trace sft --model_name_or_path meta-llama/Llama-3.1-8B --dtype bfloat16 --max_length 4096
    """
    from hpcmem.trace import run_trace

    job, ignored = job_from_cli(trainer, kwargs)
    result = run_trace(job, kernels=kernels)
    if as_json:
        click.echo(json.dumps({**result.to_json(), "ignored_settings": ignored}, indent=2))
    else:
        click.echo(result.to_text())
        if ignored:
            click.echo("ignored (no memory effect traced): " + ", ".join(ignored))

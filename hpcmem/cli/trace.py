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
@click.option("--allocator", type=click.Choice(["off", "default", "expandable", "both"]), default="off",
              show_default=True, help="replay every allocation through the caching-allocator model "
                                      "(hpcmem/trace/allocator.py) and report its reserved peak")
@click.option("--generation", is_flag=True,
              help="GRPO/RLOO: run transformers' generate to full length (slow: a forward per token)")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object (the estimate JSON contract)")
def command(trainer: str, kernels: str, allocator: str, generation: bool, as_json: bool, **kwargs) -> None:
    """Trace one GPU's peak allocated memory by running TRL's own trainer (SFT, DPO, Reward) on a fake, full-size model.

    Takes the same flags as `hpcmem estimate` (TRL field names). Needs the [train] extra (torch, transformers,
    trl, peft); runs on a login node in seconds to a minute, no GPU. Multi-GPU layouts: trace the single-GPU job,
    `hpcmem estimate` shards it.
    Example: hpcmem trace sft --model_name_or_path meta-llama/Llama-3.1-8B --dtype bfloat16 --max_length 4096
    """
    from hpcmem.trace import run_trace

    job, ignored = job_from_cli(trainer, kwargs)
    if generation and trainer not in ("grpo", "rloo"):
        raise click.UsageError(f"--generation is for grpo/rloo (they generate); {trainer} does not")
    result = run_trace(job, kernels=kernels, allocator=False if allocator == "off" else allocator,
                       generation=generation)
    if as_json:
        click.echo(json.dumps({**result.to_json(), "ignored_settings": ignored}, indent=2))
    else:
        click.echo(result.to_text())
        for mode, stats in (result.allocator or {}).items():
            click.echo(f"allocator model ({mode}): reserved peak {stats['peak_reserved_bytes'] / 1024**3:.2f} GiB, "
                       f"allocated peak {stats['peak_allocated_bytes'] / 1024**3:.2f} GiB, "
                       f"{stats['peak_segments']} segments")
        if ignored:
            click.echo("ignored (no memory effect traced): " + ", ".join(ignored))

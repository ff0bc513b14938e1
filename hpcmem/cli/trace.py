"""`hpcmem trace <trainer> …`: trace two real TRL training steps on fake tensors (no GPU) and print the peak."""

from __future__ import annotations

import json

import click

from hpcmem.cli.options import TRAINER_ARG, job_from_cli, job_options
from hpcmem.cli.outputs import PICKLE, PNG
from hpcmem.cli.trl_argv import TrlCommand
from hpcmem.job.trainers import entry
from hpcmem.plots.mpl import pyplot
from hpcmem.plots.timeline import draw_recorder
from hpcmem.trace import run_trace
from hpcmem.trace.snapshot import SnapshotRecorder


@click.command(name="trace", cls=TrlCommand)
@TRAINER_ARG
@job_options
@click.option("--kernels", type=click.Choice(["cuda", "cpu"]), default="cuda", show_default=True,
              help="cuda: map the CPU trace to what a CUDA GPU allocates (flash attention, Triton LM head, 512-B "
                   "blocks); cpu: what a CPU run allocates (the self-check's reference)")
@click.option("--allocator", type=click.Choice(["auto", "off", "default", "expandable", "both"]), default="auto",
              show_default=True, help="replay every allocation through the caching-allocator model "
                                      "(hpcmem/estimate/caching_allocator.py) and report its reserved peak; auto: the "
                                      "job's mode (expandable_segments), with --kernels cuda; off: no reserved peak "
                                      "(about 10-20 % faster)")
@click.option("--generation", is_flag=True,
              help="GRPO/RLOO: run transformers' generate to full length (slow: a forward per token)")
@click.option("--snapshot", "snapshot_path", type=PICKLE, default=None,
              help="write the traced allocation stream (with each allocation's Python frames) as a PyTorch memory "
                   "snapshot pickle: drop it on https://pytorch.org/memory_viz")
@click.option("--timeline", "timeline_path", type=PNG, default=None,
              help="write live memory over the traced step as a PNG (needs matplotlib)")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object (the estimate JSON contract)")
def command(trainer: str, kernels: str, allocator: str, generation: bool, snapshot_path: str | None,
            timeline_path: str | None, as_json: bool, **kwargs) -> None:
    """Trace one GPU's peak allocated memory by running TRL's own trainer (SFT, DPO, Reward) on a fake, full-size model.

    Takes the same flags as `hpcmem estimate` (TRL field names). Needs the [train] extra (torch, transformers,
    trl, peft); runs on a login node in seconds to a minute, no GPU. Multi-GPU layouts: trace the single-GPU job,
    `hpcmem estimate` shards it.
    Example: hpcmem trace sft --model_name_or_path meta-llama/Llama-3.1-8B --dtype bfloat16 --max_length 4096
    """
    job, ignored = job_from_cli(trainer, kwargs)
    if generation and not entry(trainer).generates:
        raise click.UsageError(f"--generation is for grpo/rloo (they generate); {trainer} does not")
    recorder = _recorder() if snapshot_path or timeline_path else None
    if timeline_path:
        pyplot("hpcmem trace --timeline")          # before minutes of tracing, not after
    if allocator == "auto":
        allocator = "auto" if kernels == "cuda" else "off"     # no CUDA caching allocator behind a CPU run
    say = None if as_json else (lambda text: click.echo(f"trace: {text}", err=True))    # stages, on stderr
    result = run_trace(job, kernels=kernels, allocator=False if allocator == "off" else allocator,
                       generation=generation, snapshot=recorder, say=say)
    pictures = _write_pictures(recorder, job, snapshot_path, timeline_path)
    if as_json:
        click.echo(json.dumps({**result.to_json(), "ignored_settings": ignored, **pictures}, indent=2))
    else:
        click.echo(result.to_text())
        for mode, stats in (result.allocator or {}).items():
            click.echo(f"allocator model ({mode}): reserved peak {stats['peak_reserved_bytes'] / 1024**3:.2f} GiB, "
                       f"allocated peak {stats['peak_allocated_bytes'] / 1024**3:.2f} GiB, "
                       f"{stats['peak_segments']} segments")
        if ignored:
            click.echo("ignored (no memory effect traced): " + ", ".join(ignored))
        if "snapshot" in pictures:
            click.echo(f"snapshot: {pictures['snapshot']} — drop it on https://pytorch.org/memory_viz")
        if "timeline" in pictures:
            click.echo(f"timeline: {pictures['timeline']}")


def _recorder():
    return SnapshotRecorder()


def _write_pictures(recorder, job, snapshot_path: str | None, timeline_path: str | None) -> dict[str, str]:
    out = {}
    if snapshot_path:
        out["snapshot"] = str(recorder.write(snapshot_path))
    if timeline_path:
        title = f"hpcmem trace · {job.train.trainer} · {job.model.name} · traced allocations (CUDA mapping)"
        out["timeline"] = str(draw_recorder(recorder, timeline_path, title=title,
                                            capacity_bytes=job.gpu.memory_bytes if job.gpu else None))
    return out

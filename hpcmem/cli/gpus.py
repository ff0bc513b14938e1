"""`hpcmem gpus`: the GPU catalog."""

from __future__ import annotations

import json

import click


@click.command(name="gpus")
@click.option("--json", "as_json", is_flag=True)
def command(as_json: bool) -> None:
    """List the GPUs hpcmem knows (memory, bf16 TFLOPS, calibration)."""
    from hpcmem.gpus import gpu_names, gpu_spec

    specs = [gpu_spec(n) for n in gpu_names()]
    if as_json:
        click.echo(json.dumps([s.__dict__ for s in specs], indent=2))
        return
    for s in specs:
        cal = "calibrated" if s.calibrated else "uncalibrated"
        click.echo(f"{s.name:<16}{s.memory_bytes / 1024**3:8.1f} GiB {s.bf16_tflops:8.0f} TFLOPS  {cal}")

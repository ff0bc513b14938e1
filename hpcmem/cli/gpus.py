"""`hpcmem gpus`: the GPU catalog."""

from __future__ import annotations

import json
from dataclasses import asdict

import click

from hpcmem.gpus.catalog import catalog_entry, gpu_names
from hpcmem.gpus.lookup import gpu_spec


@click.command(name="gpus")
@click.option("--json", "as_json", is_flag=True)
def command(as_json: bool) -> None:
    """List the GPUs hpcmem knows: memory (nvidia-smi's total), usable capacity (torch's), bf16 TFLOPS, calibration
    and the safe-bound margin of the device peak (its own, or the default borrowed from calibrated GPUs)."""
    specs = [gpu_spec(n) for n in gpu_names()]
    if as_json:
        click.echo(json.dumps([{**asdict(s), "capacity_source": catalog_entry(s.name).get("capacity_source", ""),
                                "capacity_derived": bool(catalog_entry(s.name).get("capacity_derived"))}
                               for s in specs], indent=2))
        return
    click.echo(f"{'gpu':<16}{'memory':>10}{'usable':>10}{'TFLOPS':>9}  calibration / device margin")
    for s in specs:
        m = s.margin("device")
        margin = "margin 0" if m is None else (
            f"{'calibrated' if not m.default else 'uncalibrated, default'} {100 * m.margin:.1f} %"
            + (f" from {m.calibrated_on}" if m.default else f" (n = {m.n})"))
        derived = "*" if catalog_entry(s.name).get("capacity_derived") else " "
        click.echo(f"{s.name:<16}{s.memory_bytes / 1024**3:7.1f} GiB{s.usable_bytes / 1024**3:6.1f} GiB{derived}"
                   f"{s.bf16_tflops:8.0f}  {margin}")
    click.echo("usable: torch.cuda.mem_get_info()'s total (* derived, no published measurement: hpcmem gpus --json "
               "gives each source)")

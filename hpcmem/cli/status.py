"""`hpcmem status RUN`: the job of a run folder, from scontrol (squeue, sacct when available) and its checkpoints."""

from __future__ import annotations

import json

import click

from hpcmem.launch.monitor import status


@click.command(name="status")
@click.argument("run", type=click.Path(exists=True, file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="one JSON object")
def command(run: str, as_json: bool) -> None:
    """State of the SLURM job submitted from RUN (a run folder written by `hpcmem submit`)."""
    st = status(run)
    if as_json:
        click.echo(json.dumps(st.to_json(), indent=2))
        return
    click.echo(f"job {st.job_id}: {st.state}  (from {st.source})")
    for key, value in st.fields.items():
        click.echo(f"  {key:12} {value}")
    click.echo(f"  checkpoints  {len(st.checkpoints)}" + (f", newest {st.checkpoints[-1]}" if st.checkpoints else ""))
    if st.note:
        click.echo(f"  note: {st.note}")

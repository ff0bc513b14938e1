"""`hpcmem logs RUN`: the last lines of each log of a run (batch shell, one per node, vLLM server)."""

from __future__ import annotations

import time

import click

from hpcmem.launch.monitor import log_files, tail


@click.command(name="logs")
@click.argument("run", type=click.Path(exists=True, file_okay=False))
@click.option("-n", "--lines", type=click.IntRange(min=0, max=10**6), default=20, show_default=True,
              help="lines per log")
@click.option("--node", type=click.IntRange(min=0, max=10**6), default=None,
              help="only node N's log (node0.log is the rank-0 node)")
@click.option("-f", "--follow", is_flag=True, help="keep printing new lines (Ctrl-C to stop)")
def command(run: str, lines: int, node: int | None, follow: bool) -> None:
    """Tail the logs in RUN/logs: batch-<jobid>.log, node<N>.log (appended across requeues), vllm.log."""
    files = [f for f in log_files(run) if node is None or f.name == f"node{node}.log"]
    if not files:
        which = "pending job" if node is None else f"pending job, or --node {node} does not exist"
        raise click.ClickException(f"no logs yet in {run}/logs ({which})")
    for path in files:
        click.echo(f"==> {path} <==")
        click.echo("\n".join(tail(path, lines)))
    offsets = {path: path.stat().st_size for path in files}
    while follow:
        time.sleep(2)
        _print_new(offsets)


def _print_new(offsets: dict) -> None:
    """Print what each log gained since its recorded offset, and move the offset; a log that is gone or is no longer
    a regular file is skipped (hpcmem.launch.monitor.log_files reads regular files only)."""
    for path, start in offsets.items():
        try:
            if not path.is_file():
                continue
            size = path.stat().st_size
            if size > start:
                with open(path, errors="replace") as fh:
                    fh.seek(start)
                    click.echo(fh.read(), nl=False)
        except OSError:          # removed between the check and the read
            continue
        offsets[path] = size

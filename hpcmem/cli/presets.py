"""`hpcmem presets list|show|check`: the site presets on the search path, one in full, one against SLURM."""

from __future__ import annotations

import json

import click


@click.group(name="presets")
def command() -> None:
    """Site presets (admin YAML): list them, show one, check one against the cluster.

    Search path: --preset FILE, $HPCMEM_PRESETS (colon-separated folders), /etc/hpcmem/presets,
    ~/.config/hpcmem/presets, then the examples shipped with hpcmem.
    """


@command.command(name="list")
def list_presets() -> None:
    """Every preset on the search path (a name found twice: the first folder wins)."""
    from hpcmem.launch import presets

    for path in presets.available():
        try:
            p = presets.load(path)
            click.echo(f"{p.name:28} {p.partition:14} {p.gpus_per_node} × {p.gpu:12} max {p.max_time:12} {path}")
        except Exception as exc:  # a broken preset is listed with its problem, the others still show
            click.echo(f"{path.stem:28} INVALID: {exc}")


@command.command(name="show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="the resolved preset as JSON")
def show(name: str, as_json: bool) -> None:
    """One preset, resolved (defaults filled in) — NAME on the search path or a FILE."""
    from hpcmem.launch import presets
    from hpcmem.launch.runfolder import _jsonable

    data = _jsonable(presets.load(name))
    click.echo(json.dumps(data, indent=2) if as_json else "\n".join(f"{k:20} {v}" for k, v in data.items()))


@command.command(name="check")
@click.argument("name")
def check(name: str) -> None:
    """Compare a preset with `scontrol show partition` and `sinfo` (needs SLURM reachable); exit 1 on a mismatch."""
    from hpcmem.launch import presets
    from hpcmem.launch.preset_check import check as run_check

    preset = presets.load(name)
    results = run_check(preset)
    for r in results:
        click.echo(f"{'ok ' if r.ok else 'BAD'}  {r.what:36} preset {r.preset:14} cluster {r.cluster}")
    if not all(r.ok for r in results):
        raise click.exceptions.Exit(1)

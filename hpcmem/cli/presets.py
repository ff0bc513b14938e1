"""`hpcmem presets list|show|check`: the site presets on the search path, one in full, one against SLURM."""

from __future__ import annotations

import json

import click

from hpcmem.errors import HpcmemError
from hpcmem.launch import presets
from hpcmem.launch.preset_check import check as run_check
from hpcmem.launch.runfolder import _jsonable


@click.group(name="presets")
def command() -> None:
    """Site presets (admin YAML): list them, show one, check one against the cluster.

    Search path: --preset FILE, $HPCMEM_PRESETS (colon-separated folders), /etc/hpcmem/presets,
    ~/.config/hpcmem/presets, then the examples shipped with hpcmem.
    """


@command.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="one JSON list: name, partition, gpu, gpus_per_node, max_time, "
              "file, and the problem of a preset that does not load (null when it loads)")
def list_presets(as_json: bool) -> None:
    """Every preset on the search path (a name found twice: the first folder wins)."""
    rows = []
    for path in presets.available():
        try:
            p = presets.load(path)
            rows.append({"name": p.name, "partition": p.partition, "gpu": p.gpu, "gpus_per_node": p.gpus_per_node,
                         "max_time": p.max_time, "file": str(path), "problem": None})
        except HpcmemError as exc:  # a broken preset is listed with its problem, the others still show
            problems = getattr(exc, "problems", None) or [str(exc)]
            rows.append({"name": path.stem, "partition": None, "gpu": None, "gpus_per_node": None, "max_time": None,
                         "file": str(path), "problem": "; ".join(problems)})
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    for r in rows:
        if r["problem"] is None:
            click.echo(f"{r['name']:28} {r['partition']:14} {r['gpus_per_node']} × {r['gpu']:12} max "
                       f"{r['max_time']:12} {r['file']}")
        else:
            click.echo(f"{r['name']:28} INVALID: {r['problem']}")


@command.command(name="show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="the resolved preset as JSON")
def show(name: str, as_json: bool) -> None:
    """One preset, resolved (defaults filled in) — NAME on the search path or a FILE."""
    data = _jsonable(presets.load(name))
    click.echo(json.dumps(data, indent=2) if as_json else "\n".join(f"{k:20} {v}" for k, v in data.items()))


@command.command(name="check")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True,
              help="one JSON object: preset, ok, checks (what, preset, cluster, ok each)")
def check(name: str, as_json: bool) -> None:
    """Compare a preset with `scontrol show partition` and `sinfo` (needs SLURM reachable); exit 1 on a mismatch."""
    import dataclasses

    preset = presets.load(name)
    results = run_check(preset)
    if as_json:
        click.echo(json.dumps({"preset": preset.name, "ok": all(r.ok for r in results),
                               "checks": [dataclasses.asdict(r) for r in results]}, indent=2))
    for r in results if not as_json else ():
        click.echo(f"{'ok ' if r.ok else 'BAD'}  {r.what:36} preset {r.preset:14} cluster {r.cluster}")
    if not all(r.ok for r in results):
        raise click.exceptions.Exit(1)

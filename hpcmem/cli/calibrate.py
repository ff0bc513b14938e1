"""`hpcmem calibrate`: a campaign of probe runs on a preset's GPUs as SLURM arrays; collect fits and installs."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import click

from hpcmem.calibrate import site_cases, task
from hpcmem.calibrate import submit as sub
from hpcmem.calibrate.campaign import Campaign
from hpcmem.calibrate.collect import collect
from hpcmem.calibrate.submit import Options, record
from hpcmem.calibrate.task import run_local
from hpcmem.errors import HpcmemError
from hpcmem.inputs import values as v
from hpcmem.launch import load_preset
from hpcmem.launch.backends import run_command

GIB = 1024**3


def _options(preset: Any, kw: dict[str, Any]) -> Any:
    for flag in ("site", "only"):        # site names the calibration in every estimate's line; only selects cases
        if kw[flag] is not None:
            v.text(f"--{flag}", kw[flag], max_len=1000)     # an InputError: one line, like every refusal here
    if kw["only"] is not None and not [p for p in kw["only"].split(",") if p.strip()]:
        raise HpcmemError(f"--only {kw['only']!r} holds no case pattern; give comma-separated patterns such as "
                          "'sft-q05-*,zero3-*', or leave --only out for every case")
    if kw["device"] == "cpu" and not kw["tiny"]:
        # a CPU node runs full-size 7B–70B cases for hours and measures no GPU peak: a rehearsal is shrunken
        raise HpcmemError("--device cpu is a rehearsal of the campaign on CPU nodes: add --tiny (every model shrunk, "
                          "as the GPU kit does); full-size cases belong on the preset's GPUs (--device cuda)")
    extra = site_cases.load(kw["cases_file"], gpus_per_node=preset.gpus_per_node,
                            max_nodes=preset.max_nodes) if kw["cases_file"] else []
    return Options(campaign_dir=Path(kw["campaign_dir"] or f"campaigns/{preset.name}"), device=kw["device"],
                   tiny=kw["tiny"], steps=kw["steps"], max_parallel=kw["max_parallel"], time=kw["time"],
                   collect_time=kw["collect_time"], site=kw["site"], only=kw["only"], extra_cases=tuple(extra),
                   install_dir=Path(kw["install_dir"]) if kw["install_dir"] else None,
                   retry_failed=kw["retry_failed"])


def _case_rows(p: Any) -> list[dict[str, Any]]:
    cases = p.campaign.cases()
    rows = []
    for name in p.pending + sorted(p.skipped):
        c = cases[name]
        rows.append({"case": name, "family": c.family, "trainer": c.case.trainer, "gpus": c.gpus, "nodes": c.nodes,
                     "predicted_bytes": c.predicted_bytes, "capacity_bytes": c.capacity_bytes,
                     "fraction": None if c.fraction is None else round(c.fraction, 4),
                     "state": "to run" if name in p.pending else p.skipped[name]})
    return rows


def _print_plan(p: Any, *, dry_run: bool) -> None:
    camp = p.campaign
    click.echo(f"campaign {camp.name} ({camp.root}): {camp.gpu_name} at {camp.data['site']}, preset "
               f"{camp.data['preset']}, device {camp.data['device']}; calibration installs into "
               f"{camp.data['install_dir']}/calibrations")
    if dry_run:
        for job in p.jobs:
            click.echo(f"\n==== scripts/{job.group}.sbatch ({job.kind}, {len(job.cases)} case(s)) ====")
            click.echo(p.scripts[job.group], nl=False)
    click.echo(f"\n{'case':<34} {'family':<9} {'GPUs×nodes':>10} {'predicted':>10} {'of cap':>7}  state")
    for r in _case_rows(p):
        pred = "-" if r["predicted_bytes"] is None else (f"{r['predicted_bytes'] / GIB:.2f} GiB"
                                                         if r["predicted_bytes"] >= GIB / 10 else
                                                         f"{r['predicted_bytes'] / 2**20:.1f} MiB")
        frac = "-" if r["fraction"] is None else f"{100 * r['fraction']:.0f} %"
        click.echo(f"{r['case']:<34} {r['family']:<9} {r['gpus']:>5}×{r['nodes']:<4} {pred:>10} {frac:>7}  {r['state']}")
    for note in p.notes:
        click.echo(f"note: {note}")
    ids = [f"<{j.group}>" for j in p.jobs if j.kind != "collect"]
    if dry_run and p.jobs:
        click.echo("\nsubmission order: " + "; ".join(f"sbatch --parsable scripts/{j.group}.sbatch" for j in p.jobs
                                                        if j.kind != "collect")
                   + f"; sbatch --parsable --dependency=afterany:{':'.join(ids)} scripts/{p.jobs[-1].group}.sbatch")


def _plan_json(p: Any) -> dict[str, Any]:
    return {"campaign": str(p.campaign.root), "site": p.campaign.data["site"], "gpu": p.campaign.gpu_name,
            "install_dir": p.campaign.data["install_dir"],
            "jobs": [{"group": j.group, "kind": j.kind, "cases": list(j.cases), "gpus": j.gpus, "nodes": j.nodes,
                      "max_parallel": j.max_parallel, "script": p.scripts[j.group]} for j in p.jobs],
            "cases": _case_rows(p), "notes": p.notes}


def _campaign_run(preset_ref: str, kw: dict[str, Any]) -> None:
    preset = load_preset(preset_ref)
    opt = _options(preset, kw)
    with tempfile.TemporaryDirectory(prefix="hpcmem-calibrate-") as tmp:
        p = sub.plan(preset, opt, run_command, models_dir=Path(tmp) / "models" if kw["dry_run"] else None)
        if kw["dry_run"]:
            click.echo(json.dumps(_plan_json(p), indent=1) if kw["as_json"] else "", nl=False)
            if not kw["as_json"]:
                _print_plan(p, dry_run=True)
            return
    if kw["local"]:
        _local(p, kw)
        return
    submitted = sub.submit(p, run_command) if p.jobs else []
    _report_submitted(p, submitted, kw["as_json"])


def _report_submitted(p: Any, submitted: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps({**_plan_json(p), "submitted": submitted}, indent=1))
        return
    _print_plan(p, dry_run=False)
    for s in submitted:
        click.echo(f"submitted {s['group']} ({s['kind']}, {s['cases']} case(s)): job {s['job_id']}")
    if not submitted:
        skipped = list(p.skipped.values())
        click.echo(f"campaign {p.campaign.name}: nothing to submit — {skipped.count('recorded')} recorded, "
                   f"{sum(s.startswith('failed') for s in skipped)} failed, {skipped.count('in flight')} in flight "
                   f"(hpcmem calibrate --collect {p.campaign.root} fits again; --retry-failed runs the failed ones)")


def _local(p: Any, kw: dict[str, Any]) -> None:
    record(p)
    outcome = run_local(p.campaign, p.pending, quiet=kw["as_json"])
    out = collect(p.campaign, install_dir=kw["install_dir"], png=not kw["no_png"])
    click.echo(json.dumps({"cases": outcome, **out}, indent=1, default=str) if kw["as_json"] else
               f"local campaign: {sum(v == 'done' for v in outcome.values())} of {len(outcome)} ran; calibration "
               f"{out['calibration']}; report {out['report']}")


def _status(folder: str, as_json: bool) -> None:
    camp = Campaign.load(folder)
    done, failed = camp.done(), camp.failed()
    rows = {n: "recorded" if n in done else f"failed: {failed[n]}" if n in failed else camp.status(n)["state"]
            for n in sorted(camp.data["cases"])}
    if as_json:
        click.echo(json.dumps({"campaign": str(camp.root), "records": len(camp.records()), "cases": rows}, indent=1))
        return
    for name, state in rows.items():
        click.echo(f"{name:<40} {state}")
    click.echo(f"{len(done)} recorded, {len(failed)} failed, {len(rows) - len(done) - len(failed)} not (yet) recorded")


@click.command(name="calibrate")
@click.option("--preset", "preset_ref", default=None, help="plan (and submit) a campaign on this preset's GPUs")
@click.option("--collect", "collect_dir", type=click.Path(file_okay=False, exists=True), default=None,
              help="merge a campaign's records, fit its GPU's calibration, write the report, install")
@click.option("--status", "status_dir", type=click.Path(file_okay=False, exists=True), default=None,
              help="each case of a campaign: recorded, failed (why), not yet")
@click.option("--campaign", "campaign_dir", type=click.Path(file_okay=False), default=None,
              help="the campaign folder (default campaigns/<preset>); re-running it submits only what is left")
@click.option("--device", type=click.Choice(["cuda", "cpu"]), default="cuda", show_default=True,
              help="cpu: a rehearsal on CPU nodes (with --tiny): measures tensor bytes, no GPU peak")
@click.option("--tiny", is_flag=True, help="shrink every model, as the GPU kit does (CPU rehearsals, tests)")
@click.option("--steps", type=click.IntRange(2, 100), default=3, show_default=True, help="optimizer steps per run")
@click.option("--max-parallel", "--max_parallel", "max_parallel", type=click.IntRange(1, 100000), default=4,
              show_default=True, help="array tasks at once (the K of --array=0-N%K)")
@click.option("--time", default="30", show_default=True, help="time limit of each case's job (SLURM's formats)")
@click.option("--collect-time", "collect_time", default="20", show_default=True, help="time limit of the collect job")
@click.option("--site", default=None, help="the site the calibration names (default: SLURM's ClusterName)")
@click.option("--only", default=None, help="only the cases whose names match these comma-separated patterns "
              "(fnmatch: 'sft-q05-*,zero3-*')")
@click.option("--cases", "cases_file", type=click.Path(dir_okay=False, exists=True), default=None,
              help="a YAML list of the site's own cases (name, trainer, model, flags, gpus, nodes)")
@click.option("--install-dir", "install_dir", type=click.Path(file_okay=False), default=None,
              help="the site data folder the calibration installs into (default: $HPCMEM_DATA, else /etc/hpcmem "
                   "when writable, else ~/.config/hpcmem)")
@click.option("--retry-failed", "retry_failed", is_flag=True, help="submit again the cases recorded as failed")
@click.option("--dry-run", "dry_run", is_flag=True, help="print the scripts, the cases with their predicted peaks "
              "and the collect job; write and submit nothing")
@click.option("--local", is_flag=True, help="run the cases one by one here (no scheduler), then collect")
@click.option("--no-png", "no_png", is_flag=True, help="with --collect/--local: no accuracy PNG")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
@click.option("--run-task", "run_task", hidden=True, default=None)
@click.option("--group", hidden=True, default=None)
@click.option("--index", type=int, hidden=True, default=0)
@click.option("--stage", type=click.Choice(["prepare", "finish", "give-up"]), hidden=True, default=None)
@click.option("--rank-worker", "rank_worker", hidden=True, default=None)
def command(preset_ref: str | None, collect_dir: str | None, status_dir: str | None, run_task: str | None,
            rank_worker: str | None, **kw: Any) -> int:
    """Measure hpcmem on a preset's GPUs: a campaign of probe runs submitted as SLURM job arrays, then collected
    into the GPU's calibration. Example: hpcmem calibrate --preset mycluster-h100 --dry-run"""
    if sum(x is not None for x in (preset_ref, collect_dir, status_dir, run_task, rank_worker)) != 1:
        raise HpcmemError("give exactly one of --preset NAME, --collect CAMPAIGN or --status CAMPAIGN")
    if run_task or rank_worker:
        return task.rank_worker(rank_worker) if rank_worker else task.run_task(
            Campaign.load(run_task), kw["group"], kw["index"], kw["stage"])
    if status_dir:
        return _status(status_dir, kw["as_json"])
    if collect_dir:
        return _collect(collect_dir, kw)
    _campaign_run(preset_ref, kw)
    return 0


def _collect(folder: str, kw: dict[str, Any]) -> int:
    out = collect(Campaign.load(folder), install_dir=kw["install_dir"], png=not kw["no_png"])
    c = out["campaign"]
    click.echo(json.dumps(out, indent=1, default=str) if kw["as_json"] else
               f"campaign {c['name']} at {c['site']}: {c['n']} records ({c['cases']['done']} of "
               f"{c['cases']['planned']} cases recorded, {c['cases']['failed']} failed, "
               f"{len(c['cases']['missing'])} missing); calibration {out['calibration'] or 'none'}; "
               f"report {out['report']}")
    return 0

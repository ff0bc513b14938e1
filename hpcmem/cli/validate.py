"""`hpcmem validate --against probes|trace`: how far the estimate is from the instruments, per cell and peak."""

from __future__ import annotations

import importlib.util
import json

import click

from hpcmem.cli.options import typed
from hpcmem.cli.outputs import PNG
from hpcmem.datapath import estimator_dir
from hpcmem.errors import HpcmemError
from hpcmem.models.coverage import classification, installed_mapping
from hpcmem.validate import against_probes, boundary, coverage, trace
from hpcmem.validate.speed import render as render_speed
from hpcmem.validate.table import render


def _check_types(chosen: list[str] | None) -> None:
    """--types names model types hpcmem's table or the installed transformers' causal-LM mapping has; anything else
    (a typo) would be swept into the shared records as 'unclassified'."""
    known = set(classification()["types"]) | set(installed_mapping() or {})
    unknown = [t for t in chosen or () if t not in known]
    if unknown:
        raise HpcmemError(f"--types {','.join(unknown)}: not a causal-LM model type of hpcmem/models/coverage.json or "
                          "the installed transformers (`hpcmem models coverage` lists them)")


# the --against modes that read each option (the branches of `command` below); --json is every mode's, and --no-png
# (asking for no picture) is harmless anywhere
READ_BY = {"records": ("probes", "boundary"), "gpu": ("probes", "boundary"), "stored": ("probes", "boundary"),
           "png": ("probes",), "fit": ("probes",), "fit_dir": ("probes",), "speed": ("probes",),
           "cases": ("trace",), "ci_only": ("trace",), "reserved": ("trace",), "events_dir": ("trace",),
           "workers": ("trace", "coverage"), "rescore": ("trace", "coverage"), "types": ("coverage",),
           "redo": ("coverage",)}


def _check_modes(against: str, *, fit: bool, reserved: bool) -> None:
    """A flag typed for a mode other than --against's would be dropped without a word: refused, naming who reads it."""
    ctx = click.get_current_context()
    flag = {p.name: p.opts[0] for p in ctx.command.params}
    given = [name for name in READ_BY if typed(name)]
    for name in given:
        if against not in READ_BY[name]:
            raise HpcmemError(f"{flag[name]} is read with --against {' or '.join(READ_BY[name])} only; got --against "
                              f"{against}")
    if "fit_dir" in given and not fit:
        raise HpcmemError(f"{flag['fit_dir']} says where --fit writes the calibration; add --fit or drop it")
    if "events_dir" in given and not reserved:
        raise HpcmemError(f"{flag['events_dir']} keeps the streams --reserved records; add --reserved or drop it")


@click.command(name="validate")
@click.option("--against", type=click.Choice(["probes", "trace", "boundary", "coverage"]), default="probes",
              show_default=True,
              help="probes: GPU/CPU probe records (estimator/probes); trace: the trace matrix; boundary: the probe "
                   "runs predicted at 85–105 % of their capacity — false fits and false refusals, by the point "
                   "estimate and by the safe bound; coverage: every covered model type against a trace (traces the "
                   "types without records and appends theirs to estimator/coverage.jsonl; types it does not trace "
                   "are listed, not written)")
@click.option("--records", multiple=True, type=click.Path(exists=True),
              help="records files or folders (default estimator/probes/)")
@click.option("--gpu", default=None, help="only this GPU model's records (e.g. H100-80GB, cpu)")
@click.option("--png", type=PNG, default=None,
              help="write the predicted-vs-measured scatter here (default estimator/accuracy-probes.png)")
@click.option("--no-png", is_flag=True, help="no scatter")
@click.option("--fit", is_flag=True, help="fit the per-GPU calibration from the records and store it as "
              "<gpu>.json with provenance (in $HPCMEM_DATA/calibrations when set, else hpcmem/calibrations/ in a "
              "checkout, else ~/.config/hpcmem/calibrations)")
@click.option("--fit-dir", "--fit_dir", "fit_dir", type=click.Path(file_okay=False), default=None,
              help="with --fit: write the calibration into this folder instead")
@click.option("--stored", is_flag=True, help="use the estimates stored in the records instead of re-estimating")
@click.option("--speed", is_flag=True, help="with --against probes: predicted vs measured tokens/s per run and the rank "
              "agreement (Kendall's tau) of the planner's ordering; with --fit the GPU's MFU curve is fitted from the "
              "runs that timed their steps")
@click.option("--json", "as_json", is_flag=True, help="print the table as JSON")
@click.option("--cases", type=click.Path(exists=True, dir_okay=False), default=None,
              help="with --against trace: one case file (default every estimator/cases/*.yaml)")
@click.option("--ci", "ci_only", is_flag=True, help="with --against trace: only the cases marked ci: true")
@click.option("--workers", type=click.IntRange(1, 64), default=2, show_default=True,
              help="with --against trace: trace processes in parallel (each holds torch, ~1 GiB)")
@click.option("--rescore", is_flag=True, help="with --against trace: re-estimate the stored traces "
                                              "(estimator/traces/) without tracing again")
@click.option("--reserved", is_flag=True, help="with --against trace: score the estimate's reserved peak against the "
                                               "caching-allocator model replaying each trace (traced with the model "
                                               "on, resumably; with --rescore, from the stored numbers)")
@click.option("--events", "events_dir", type=click.Path(file_okay=False), default=None,
              help="with --against trace --reserved: also keep each case's device stream here (gzip JSON)")
@click.option("--types", default=None, help="with --against coverage: comma-separated model types (default all)")
@click.option("--redo", is_flag=True, help="with --against coverage: trace types again that have records")
def command(against: str, records: tuple[str, ...], gpu: str | None, png: str | None, no_png: bool, fit: bool,
            fit_dir: str | None, stored: bool, speed: bool, as_json: bool, cases: str | None, ci_only: bool,
            workers: int, rescore: bool, reserved: bool, events_dir: str | None, types: str | None,
            redo: bool) -> None:
    """Error of the estimate per trainer × technique and per peak (allocated, reserved, device): n, median, p95 and
    max |error| %, bias, and the safe bound's under-estimate rate and slack."""
    _check_modes(against, fit=fit, reserved=reserved)
    if against == "coverage":
        chosen = [t.strip() for t in types.split(",")] if types else None
        _check_types(chosen)
        if rescore:
            recs = coverage.rescore(types=chosen)
            coverage.write_records(recs)
        else:
            recs = coverage.run(chosen, redo=redo, workers=workers, progress=coverage.print_progress)

        report = estimator_dir() / "COVERAGE.md"
        report.write_text(coverage.report_markdown(coverage.load_records()))
        skipped = [r["model_type"] for r in recs if "skipped" in r and not rescore]
        verb = "rescored in" if rescore else "appended to"
        written = f"{len(recs) - len(skipped)} records {verb} estimator/coverage.jsonl"
        if skipped:
            written += (f"; {len(skipped)} types not traced, not written (not applicable or refused: `hpcmem models "
                        f"coverage` says why): {', '.join(skipped)}")
        click.echo(json.dumps(recs, indent=1) if as_json else f"{written}; table: {report}")
        return
    if against == "trace":
        if importlib.util.find_spec("hpcmem.validate.trace") is None:
            raise HpcmemError("validate --against trace is not available yet (hpcmem.validate.trace is missing); "
                              "use --against probes")

        trace.run(cases=cases, ci_only=ci_only, workers=workers, as_json=as_json, rescore_only=rescore,
                  reserved=reserved, events_dir=events_dir)
        return

    if against == "boundary":
        _boundary(list(records) or [estimator_dir() / "probes"], stored, gpu, as_json)
        return

    out_png = None if no_png else (png or estimator_dir() / "accuracy-probes.png")
    report = against_probes(list(records) or None, png=out_png, fit=fit, stored=stored, gpu=gpu, fit_dir=fit_dir,
                            speed=speed)
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=1))
        return
    click.echo(f"{report.num_records} probe records from {', '.join(report.files) or 'nowhere'}")
    click.echo(render(report.rows) if report.rows else "no estimate/measurement pairs")
    if speed:
        click.echo("\nspeed: tokens/s per GPU, measured vs the planner's throughput model (hpcmem.validate.speed)")
        click.echo(render_speed(report.speed) if report.speed else "no timed runs the model covers")
    for line in report.notes + [f"calibration written: {c}" for c in report.calibrations]:
        click.echo(f"note: {line}")
    if report.png:
        click.echo(f"scatter: {report.png}")


def _boundary(paths: list, stored: bool, gpu: str | None, as_json: bool) -> None:
    from dataclasses import asdict

    table, notes = boundary.rows(paths, stored=stored, gpu=gpu)
    if as_json:
        click.echo(json.dumps({"window": boundary.WINDOW, "summary": boundary.summary(table),
                               "runs": [{**asdict(r), "fraction": round(r.fraction, 4), "point_fits": r.point_fits,
                                         "safe_fits": r.safe_fits} for r in table], "notes": notes}, indent=1))
        return
    click.echo(boundary.render(table) if table else "no probe runs predicted at 85–105 % of their capacity yet "
               "(the GPU kit's boundary sweep makes them: estimator/gpu/run_matrix.sh)")
    for line in notes:
        click.echo(f"note: {line}")

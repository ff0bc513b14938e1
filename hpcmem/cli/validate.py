"""`hpcmem validate probes|boundary|trace|coverage|random|published`: how far the estimate is from the instruments,
from random jobs and from published measurements, per cell and peak.

Each instrument is a subcommand with its own flags. The older form `validate --against MODE …` (and a bare
`validate …`, which meant probes) is read as `validate MODE …`."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import click

from hpcmem.cli.outputs import PNG
from hpcmem.datapath import PACKAGE_DIR, estimator_dir
from hpcmem.errors import HpcmemError
from hpcmem.estimate.learned import variant_techniques
from hpcmem.gpus.calibration import MULTI_GPU_FILE, SINGLE_GPU_FILE
from hpcmem.inputs.values import row_lengths, text
from hpcmem.models.coverage import (SHIPPED_SUMMARY, SHIPPED_VLM_SUMMARY, classification, installed_mapping,
                                    summary_to_ship, vision_language_rows)
from hpcmem.validate import (against_probes, boundary, coverage, coverage_vlm, published_score, random_report,
                             random_run, trace, vlm_trainable)
from hpcmem.validate import published as published_rows
from hpcmem.validate import published_margin, published_speed, published_speed_score
from hpcmem.validate.calibration import default_fit_dir
from hpcmem.validate.probes import filter_problems
from hpcmem.validate.speed import render as render_speed
from hpcmem.validate.table import render

MODES = ("probes", "trace", "boundary", "coverage", "random", "published")
DEFAULT_MODE = "probes"


class _Instruments(click.Group):
    """The group, reading `--against MODE` (anywhere before `--`) as the subcommand MODE, and no subcommand as probes.
    A flag of another subcommand is refused naming the subcommands that read it (click alone would say only "No such
    option")."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        args = against_as_subcommand(args)
        if args and not args[0].startswith("-") and args[0] not in self.commands:
            raise click.UsageError(f"no instrument {args[0]!r}: one of {', '.join(MODES)}", ctx)
        mode = self.commands.get(args[0]) if args else None
        if mode is not None:
            own = {opt for param in mode.params for opt in param.opts}
            for arg in args[1:args.index("--") if "--" in args else len(args)]:
                flag = arg.split("=", 1)[0]
                readers = [name for name, cmd in self.commands.items()
                           if any(flag in param.opts for param in cmd.params)]
                if flag.startswith("--") and flag not in own and readers:
                    raise click.UsageError(f"{flag} is read by {' and '.join(f'`validate {r}`' for r in readers)} "
                                           f"only; got `validate {mode.name}`", ctx)
        return super().parse_args(ctx, args)


def against_as_subcommand(args: list[str]) -> list[str]:
    """`--against trace --rescore` → `trace --rescore`; `--json` → `probes --json`; help and a named mode as given.
    A mode --against names that is not one of MODES stays a subcommand name, which click refuses with the valid ones."""
    if not args or args[0] in MODES or args[0] in ("-h", "--help"):
        return list(args)
    head = args[:args.index("--")] if "--" in args else list(args)
    for i, arg in enumerate(head):
        if arg == "--against" and i + 1 < len(head):
            return [head[i + 1], *args[:i], *args[i + 2:]]
        if arg.startswith("--against="):
            return [arg.split("=", 1)[1], *args[:i], *args[i + 1:]]
    return [DEFAULT_MODE, *args]


@click.group(name="validate", cls=_Instruments)
def command() -> None:
    """Error of the estimate per trainer × technique and per peak (allocated, reserved, device): n, median, p95 and
    max |error| %, bias, and the safe bound's under-estimate rate and slack — against GPU/CPU probe records
    (probes), the probe runs near their capacity (boundary), the trace matrix (trace), every covered model type
    (coverage), random jobs (random) or peaks others measured and published (published)."""


RECORDS = click.option("--records", multiple=True, type=click.Path(exists=True),
                       help="records files or folders (default estimator/probes/)")
GPU = click.option("--gpu", default=None, help="only this GPU model's records (e.g. H100-80GB, cpu)")
STORED = click.option("--stored", is_flag=True, help="use the estimates stored in the records instead of re-estimating")
JSON = click.option("--json", "as_json", is_flag=True, help="print the table as JSON")
# asking for no picture is harmless in every subcommand (only probes draws one)
NO_PNG = click.option("--no-png", "no_png", is_flag=True, hidden=True)
WORKERS = click.option("--workers", type=click.IntRange(1, 64), default=2, show_default=True,
                       help="trace processes in parallel (each holds torch, ~1 GiB)")


@command.command("probes")
@RECORDS
@GPU
@click.option("--png", type=PNG, default=None,
              help="write the predicted-vs-measured scatter here (default estimator/accuracy-probes.png)")
@click.option("--no-png", is_flag=True, help="no scatter")
@click.option("--fit", is_flag=True, help="fit the per-GPU calibration from the records and store it as "
              "<gpu>.json with provenance (in $HPCMEM_DATA/calibrations when set, else hpcmem/calibrations/ in a "
              "checkout, else ~/.config/hpcmem/calibrations)")
@click.option("--fit-dir", "--fit_dir", "fit_dir", type=click.Path(file_okay=False), default=None,
              help="with --fit: write the calibration into this folder instead")
@click.option("--fit-speed", "--fit_speed", "fit_speed", is_flag=True,
              help="refit only the MFU curve of each GPU's existing calibration from the runs that timed their steps "
              "(context, allocator and margins stay as fitted); prints in-sample and leave-one-out ratios")
@click.option("--score-since-fit", "--score_since_fit", "score_since_fit", is_flag=True,
              help="score each GPU's calibrated margins on the runs made after it was fitted (never in its fit) and "
              "store the tally in its calibration (margins unchanged); verdicts then show it")
@STORED
@click.option("--speed", is_flag=True, help="predicted vs measured tokens/s per run and the rank agreement "
              "(Kendall's tau) of the planner's ordering; with --fit the GPU's MFU curve is fitted from the runs that "
              "timed their steps")
@JSON
def probes(records: tuple[str, ...], gpu: str | None, png: str | None, no_png: bool, fit: bool, fit_dir: str | None,
           fit_speed: bool, score_since_fit: bool, stored: bool, speed: bool, as_json: bool) -> None:
    """The estimate against GPU/CPU probe records (estimator/probes)."""
    _check_selection(records, gpu)
    if fit_dir is not None and not text("--fit-dir", fit_dir).strip():
        raise HpcmemError(f"--fit-dir {fit_dir!r}: give a folder name")
    if fit_dir is not None and not (fit or fit_speed or score_since_fit):
        raise HpcmemError("--fit-dir says where --fit writes the calibration; add --fit (or --fit-speed, "
                          "--score-since-fit) or drop it")
    if fit + fit_speed + score_since_fit > 1:
        raise HpcmemError("--fit refits the whole calibration (its MFU curve included), --fit-speed only the MFU "
                          "curve, --score-since-fit only scores the margins on later runs: give one of them")
    out_png = None if no_png else (png or estimator_dir() / "accuracy-probes.png")
    report = against_probes(list(records) or None, png=out_png, fit=fit, stored=stored, gpu=gpu, fit_dir=fit_dir,
                            speed=speed, fit_speed=fit_speed, score_since_fit=score_since_fit)
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


def _check_selection(records: tuple[str, ...], gpu: str | None) -> None:
    problems = filter_problems(list(records) or [estimator_dir() / "probes"], gpu)
    if problems:
        raise HpcmemError(problems[0])


@command.command("boundary")
@RECORDS
@GPU
@STORED
@JSON
@NO_PNG
def boundary_command(records: tuple[str, ...], gpu: str | None, stored: bool, as_json: bool, no_png: bool) -> None:
    """The probe runs predicted at 85–105 % of their capacity: false fits and false refusals, by the point estimate
    and by the safe bound."""
    _check_selection(records, gpu)
    table, notes = boundary.rows(list(records) or [estimator_dir() / "probes"], stored=stored, gpu=gpu)
    if as_json:
        click.echo(json.dumps({"window": boundary.WINDOW, "summary": boundary.summary(table),
                               "runs": [{**asdict(r), "fraction": round(r.fraction, 4), "point_fits": r.point_fits,
                                         "safe_fits": r.safe_fits} for r in table], "notes": notes}, indent=1))
        return
    click.echo(boundary.render(table) if table else "no probe runs predicted at 85–105 % of their capacity yet "
               "(the GPU kit's boundary sweep makes them: estimator/gpu/run_matrix.sh)")
    for line in notes:
        click.echo(f"note: {line}")


@command.command("trace")
@click.option("--cases", type=click.Path(exists=True, dir_okay=False), default=None,
              help="one case file (default every estimator/cases/*.yaml)")
@click.option("--ci", "ci_only", is_flag=True, help="only the cases marked ci: true")
@WORKERS
@click.option("--rescore", is_flag=True, help="re-estimate the stored traces (estimator/traces/) without tracing again")
@click.option("--reserved", is_flag=True, help="score the estimate's reserved peak against the caching-allocator model "
              "replaying each trace (traced with the model on, resumably; with --rescore, from the stored numbers)")
@click.option("--events", "events_dir", type=click.Path(file_okay=False), default=None,
              help="with --reserved: also keep each case's device stream here (gzip JSON)")
@click.option("--only", default=None, help="case ids to trace again, comma-separated: each record is replaced in "
              "its file, the others kept (with the allocator model where the stored records have it)")
@JSON
@NO_PNG
def trace_command(cases: str | None, ci_only: bool, workers: int, rescore: bool, reserved: bool,
                  events_dir: str | None, only: str | None, as_json: bool, no_png: bool) -> None:
    """The estimate against the trace matrix (estimator/cases/, records in estimator/traces/)."""
    if events_dir is not None and not reserved:
        raise HpcmemError("--events keeps the streams --reserved records; add --reserved or drop it")
    ids = tuple(x.strip() for x in only.split(",") if x.strip()) if only is not None else ()
    if only is not None and (not ids or rescore or ci_only):
        raise HpcmemError(f"--only {only!r}: give case ids (comma-separated), without --rescore or --ci")
    trace.run(cases=cases, ci_only=ci_only, workers=workers, as_json=as_json, rescore_only=rescore,
              reserved=reserved, events_dir=events_dir, only=ids)


@command.command("coverage")
@WORKERS
@click.option("--rescore", is_flag=True, help="re-estimate the stored sweep records without tracing again")
@click.option("--types", default=None, help="comma-separated model types (default all)")
@click.option("--redo", is_flag=True, help="trace types again that have records")
@click.option("--relearn", is_flag=True, help="learn the --types' sweep profiles again (estimator/coverage-profiles), "
              "then rescore their records without tracing them again")
@click.option("--short-checks", is_flag=True, help="with --relearn: hold each profile at 8,192 tokens per row only "
              "(skips the checks at 32,768, about half the time; estimates past 8,192 then say they are not held)")
@click.option("--rows-checks", is_flag=True, help="hold the --types' stored sweep profiles at 1, 4, 8 and 16 rows "
              "per micro-batch too (a trace each at the longest held length), without learning them again")
@click.option("--add-missing", "add_missing", is_flag=True, help="add the variant cells the learner traces today "
              "to the --types' stored sweep profiles that lack them — LoRA without dropout (DPO/KTO/Reward's "
              "disable_dropout, lora_dropout 0; DoRA too), reentrant checkpointing (use_reentrant, PEFT under ZeRO-3), "
              "bf16 and fp16 off on 16-bit weights (no autocast), the model's dropout off (disable_dropout on types "
              "with dropout modules) — with "
              "their held checks, and run the rows check at the row counts a profile lacks (8 and 16), without "
              "learning the rest again; then rescore their records")
@click.option("--cells", "cells", default=None, help="with --add-missing: only the missing variant cells of these "
              "comma-separated techniques (full-noamp, lora-noamp, lora-nodrop, full-reentrant, …), and no rows check")
@click.option("--hold-longer", "hold_longer", default=None, help="hold the --types' stored sweep profiles at these "
              "comma-separated longer row lengths too (e.g. 65536,131072: a two-step trace per technique and length, "
              "within the model's max_position_embeddings; the rows check again at the new longest length), without "
              "learning them again; then rescore their records")
@click.option("--trainable", is_flag=True, help="image-text types: run TRL's SFTTrainer one CPU step on a tiny model "
              "of each of --types (default every image-text type not estimated with images), store "
              "estimator/vlm-trainable.jsonl, and write the table; nothing else is traced or rescored")
@JSON
@NO_PNG
def coverage_command(workers: int, rescore: bool, types: str | None, redo: bool, relearn: bool, short_checks: bool,
                     rows_checks: bool, add_missing: bool, cells: str | None, hold_longer: str | None,
                     trainable: bool, as_json: bool, no_png: bool) -> None:
    """Every covered model type against a trace: traces the types without records and appends theirs to
    estimator/coverage.jsonl (types it does not trace are listed, not written), and writes estimator/COVERAGE.md."""
    chosen = [t.strip() for t in types.split(",")] if types else None
    if trainable:
        if rescore or redo or relearn or rows_checks or short_checks or add_missing or hold_longer is not None:
            raise HpcmemError("--trainable: alone (with --types); it runs TRL on image-text types and rescores "
                              "nothing")
        recs = _trainable(chosen)
        _write_coverage_report()
        click.echo(json.dumps(recs, indent=1) if as_json else
                   f"{len(recs)} records written to {vlm_trainable.records_path()}; table: "
                   f"{estimator_dir() / 'COVERAGE.md'}")
        return
    _check_types(chosen)
    if short_checks and not relearn:
        raise HpcmemError("--short-checks: only with --relearn (it sets where a relearned profile is checked)")
    if relearn and not chosen:
        raise HpcmemError("--relearn: needs --types (each learn takes minutes: name the types to learn again)")
    if rows_checks and (not chosen or relearn):
        raise HpcmemError("--rows-checks: needs --types and no --relearn (a relearn runs the rows checks itself)")
    if add_missing and (not chosen or relearn or rows_checks):
        raise HpcmemError("--add-missing: needs --types and neither --relearn nor --rows-checks (a relearn learns "
                          "these cells itself)")
    wanted = tuple(c.strip() for c in cells.split(",") if c.strip()) if cells is not None else ()
    if cells is not None and not add_missing:
        raise HpcmemError("--cells: only with --add-missing (it names which missing variant cells to add)")
    if unknown := [c for c in wanted if c not in variant_techniques()]:
        raise HpcmemError(f"--cells: {', '.join(unknown)} is not a variant cell the learner traces (one of "
                          f"{', '.join(variant_techniques())})")
    if cells is not None and not wanted:
        raise HpcmemError("--cells: empty; name at least one technique (e.g. full-noamp,lora-noamp)")
    longer = row_lengths("--hold-longer", hold_longer) if hold_longer is not None else ()
    if hold_longer is not None and (not chosen or relearn or rows_checks or add_missing):
        raise HpcmemError("--hold-longer: needs --types and none of --relearn, --rows-checks, --add-missing (run them "
                          "first; this checks the profile they leave)")
    if add_missing:
        for got in coverage.add_missing(chosen, cells=wanted, workers=workers):
            click.echo(f"{got['model_type']}: " + (got.get("error") or got.get("skipped") or _added(got)), err=True)
    if rows_checks:
        for got in coverage.check_rows(chosen):
            click.echo(f"{got['model_type']}: " + (got.get("error") or f"{got['seconds']} s, held at rows "
                                                   f"{got['rows_held'][0]}–{got['rows_held'][1]}: "
                                                   f"{json.dumps(got['rows_err_pct'])}"), err=True)
    if longer:
        for got in coverage.hold_longer(chosen, longer):
            click.echo(f"{got['model_type']}: " + (got.get("error") or f"{got['seconds']} s, held at "
                                                   f"{json.dumps(got['held'])}, rows {got.get('rows_held')}"),
                       err=True)
    if relearn:
        for got in coverage.relearn(chosen, long_checks=not short_checks):
            click.echo(f"{got['model_type']}: " + (got.get("error") or f"{got['seconds']} s, held {got['held']}"),
                       err=True)
    if rescore or relearn or rows_checks or add_missing or longer:
        recs = coverage.rescore(types=chosen)
        coverage.write_records(recs)
    else:
        recs = coverage.run(chosen, redo=redo, workers=workers, progress=coverage.print_progress)
    report = _write_coverage_report()
    again = rescore or relearn or rows_checks or add_missing or bool(longer)
    skipped = [r["model_type"] for r in recs if "skipped" in r and not again]
    verb = "rescored in" if again else "appended to"
    written = f"{len(recs) - len(skipped)} records {verb} estimator/coverage.jsonl"
    if skipped:
        written += (f"; {len(skipped)} types not traced, not written (not applicable or refused: `hpcmem models "
                    f"coverage` says why): {', '.join(skipped)}")
    click.echo(json.dumps(recs, indent=1) if as_json else f"{written}; table: {report}")


@command.command("published")
@click.option("--rows", "rows_path", type=click.Path(exists=True), default=None,
              help="a published-measurements file or folder (default estimator/published/, with --speed "
              "estimator/published/speed/)")
@click.option("--speed", is_flag=True, help="the planner's throughput model against published training speeds "
              "(tokens/s per GPU): ratio error and Kendall's tau, overall and per source, and held out by source")
@click.option("--fit-margin", "fit_margin", is_flag=True,
              help=f"write the multi-GPU and single-GPU margins fitted on these rows to the calibrations folder "
              f"({MULTI_GPU_FILE}, {SINGLE_GPU_FILE})")
@JSON
@NO_PNG
def published_command(rows_path: str | None, speed: bool, fit_margin: bool, as_json: bool, no_png: bool) -> None:
    """The estimate against peak GPU memory others measured and published (estimator/published/*.yaml): per row the
    peak the source measured, raw and loop-adjusted error %, and whether `fits` agrees with the reported outcome;
    summary per class; the multi-GPU margin these rows give and its leave-one-source-out coverage. With --speed, the
    throughput model against published tokens/s (estimator/published/speed/*.yaml)."""
    if speed:
        _published_speed(rows_path, as_json)
        return
    loaded = published_rows.load(rows_path)
    scored = [published_score.score(r) for r in loaded.rows if r.scored]
    unscored = [r for r in loaded.rows if not r.scored]
    margin, single = published_margin.fit(scored), published_margin.fit(scored, multi=False)
    written = [str(published_margin.save(m, default_fit_dir() / name)) for m, name in
               ((margin, MULTI_GPU_FILE), (single, SINGLE_GPU_FILE)) if fit_margin and m]
    if as_json:
        click.echo(json.dumps(published_score.to_json(scored, unscored, loaded.files, margin, single), indent=1))
        return
    click.echo(f"{len(loaded.rows)} published rows ({len(scored)} scored) from {len(loaded.files)} files")
    click.echo(published_score.render(scored, unscored))
    click.echo(published_margin.render(margin))
    click.echo(published_margin.render(single, "single-GPU") + (f"\nwritten: {', '.join(written)}" if written else ""))


def _published_speed(rows_path: str | None, as_json: bool) -> None:
    rows, files = published_speed.load(rows_path)
    scored = [published_speed_score.score(r) for r in rows if r.scored]
    unscored = [r for r in rows if not r.scored]
    if as_json:
        click.echo(json.dumps(published_speed_score.to_json(scored, unscored, files), indent=1))
        return
    click.echo(f"{len(rows)} published speed rows ({len(scored)} scored) from {len(files)} files")
    click.echo(published_speed_score.render(scored, unscored, rows))


@command.command("random")
@click.option("--oracle", type=click.Choice(random_run.ORACLES), default="trace", show_default=True,
              help="what each job is held to: the trace, the real trainer on CPU, or properties of the estimate")
@click.option("--n", "n", type=int, default=100, show_default=True, help="jobs s<seed>-0 … s<seed>-<n-1>")
@click.option("--seed", type=int, default=1, show_default=True, help="the random stream")
@click.option("--records", type=click.Path(dir_okay=False), default=None,
              help="records file (default estimator/random/<oracle>.jsonl); recorded ids are skipped")
@click.option("--only", default=None, help="ids to run again, comma-separated (s1-62,s1-583): the job each record "
              "holds (today's draw for an id without one), its new record replacing the stored one")
@click.option("--redraw", is_flag=True, help="run again, in place, the records of s<seed>-0 … s<seed>-<n-1> whose job "
              "is no longer today's draw of their id (the stream follows the types this hpcmem covers)")
@click.option("--report", is_flag=True, help="run nothing: rescore every record against today's estimate, print the "
              "table, write estimator/random/REPORT.md (trace oracle) and cases.yaml")
@JSON
@NO_PNG
def random_command(oracle: str, n: int, seed: int, records: str | None, only: str | None, redraw: bool,
                   report: bool, as_json: bool, no_png: bool) -> None:
    """Random jobs over everything a user can set (hpcmem/validate/random_jobs.py), each held to an oracle; records
    appended to estimator/random/<oracle>.jsonl as each job finishes, a rerun skipping recorded ids."""
    path = Path(records) if records else random_run.records_path(oracle)
    if redraw and (report or only is not None):
        raise HpcmemError(f"--redraw runs the stale records of the first --n ids again; it does nothing with "
                          f"{'--report' if report else '--only'} (drop one of them)")
    if not report:
        new = random_run.run(oracle, n, seed, records=path,
                             only=random_run.parse_only(only, seed) if only is not None else (), redraw=redraw)
        if not as_json:
            click.echo(f"{len(new)} jobs {'run again in' if only else 'recorded in'} {path}; `--report` scores every "
                       "record")
            return
    stored = random_run.load(path)
    if not stored:
        raise HpcmemError(f"no random-job records at {path}; run `hpcmem validate random --oracle {oracle}` first")
    scored = random_report.rescore(oracle, stored)
    folder = path.parent
    cases_file = folder / "cases.yaml"
    random_report.write_cases(cases_file, random_report.cases(scored, oracle, random_report.read_cases(cases_file)))
    versions = next((r["versions"] for r in stored if r.get("versions")), {})
    types = len({s["job"]["model_type"] for s in scored if "job" in s})
    stale = random_run.stale_ids(stored)
    text = random_report.report_markdown(oracle, scored, versions, types, stale=len(stale))
    if oracle == "trace":
        (folder / "REPORT.md").write_text(text)
    if as_json:
        click.echo(json.dumps({"summary": random_report.summary(scored), "stale": stale, "jobs": scored}, indent=1,
                              default=str))
    else:
        click.echo(text)


def _write_coverage_report() -> Path:
    """estimator/COVERAGE.md from the stored records, and the package's own copies of the summaries."""
    report = estimator_dir() / "COVERAGE.md"
    images = coverage_vlm.summary(coverage_vlm.case_rows())
    report.write_text(coverage.report_markdown(coverage.load_records())
                      + coverage_vlm.report_markdown(images, vision_language_rows(), vlm_trainable.load_records()))
    # the package's own copy of the summary, so `hpcmem models coverage` from a wheel shows the measured accuracy —
    # written only from the checkout's own records (never from a scratch estimator folder into the package)
    if estimator_dir().resolve() == (PACKAGE_DIR.parent / "estimator").resolve():
        SHIPPED_SUMMARY.write_text(json.dumps(summary_to_ship(coverage.load_records()), indent=1) + "\n")
        SHIPPED_VLM_SUMMARY.write_text(json.dumps(images, indent=1, sort_keys=True) + "\n")
    return report


def _trainable(chosen: list[str] | None) -> list[dict[str, object]]:
    """TRL's trainer on tiny image-text models of `chosen` (default: every image-text type hpcmem does not estimate
    with images), progress on stderr."""
    rows = vision_language_rows()
    known = {r["model_type"] for r in rows}
    if chosen is not None:
        chosen = list(dict.fromkeys(t for t in chosen if t))        # each named once, in order, no empty names
        if not chosen:
            raise HpcmemError("--types: names no model type (comma-separated image-text types)")
    unknown = [t for t in chosen or () if t not in known]
    if unknown:
        shown = ",".join(unknown[:10]) + (f" and {len(unknown) - 10} more" if len(unknown) > 10 else "")
        raise HpcmemError(f"--types {shown}: not an image-text-to-text type of the installed transformers "
                          "(`hpcmem models coverage` lists them)")
    types = chosen or [r["model_type"] for r in rows if r["status"] != "derived"]

    def progress(i: int, n: int, rec: dict[str, object]) -> None:
        click.echo(f"[{i}/{n}] {rec['model_type']}: {vlm_trainable.outcome(rec)} {str(rec.get('reason') or '')[:140]}",
                   err=True)

    return vlm_trainable.run(types, progress=progress)


def _check_types(chosen: list[str] | None) -> None:
    """--types names model types hpcmem's table or the installed transformers' causal-LM mapping has; anything else
    (a typo) would be swept into the shared records as 'unclassified'."""
    known = set(classification()["types"]) | set(installed_mapping() or {})
    unknown = [t for t in chosen or () if t not in known]
    if unknown:
        raise HpcmemError(f"--types {','.join(unknown)}: not a causal-LM model type of hpcmem/models/coverage.json or "
                          "the installed transformers (`hpcmem models coverage` lists them)")


def _added(got: dict) -> str:
    """One line for a profile `coverage.add_missing` completed: the cells added and where they hold, the rows run."""
    parts = [f"{got['seconds']} s"]
    if got["added"]:
        parts.append(f"added {', '.join(got['added'])}, held {json.dumps(got['held'])}")
    if got["rows_added"]:
        lo, hi = got["rows_held"]
        parts.append(f"rows check at {', '.join(map(str, got['rows_added']))} rows: held at {lo}–{hi} rows")
    return ", ".join(parts)

"""`hpcmem validate trace`: run the case matrix through the trace and the estimate, keep the records, print
the error per cell (trainer × technique) of the allocated peak.

Cases are data (estimator/cases/*.yaml): `cases:` is a list of mappings with an `id`, the `trainer` and TRL fields
(what `--config` takes), optionally `ci: true` for the subset CI runs. Each case is traced in a worker process
(`--kernels cuda` mapping) and estimated in the parent; records go to estimator/traces/<cases file stem>.jsonl with the
versions of torch/transformers/trl/peft, one line per case.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcmem.datapath import estimator_dir
from hpcmem.errors import HpcmemError, SpecError
from hpcmem.estimate import estimate
from hpcmem.estimate.workspaces import tensor_bytes
from hpcmem.job.trl_config import read_yaml
from hpcmem.progress import Progress
from hpcmem.record.cells import cell_of
from hpcmem.trace import run_trace
from hpcmem.trace.events import save
from hpcmem.trace.threads import share_cpus
from hpcmem.validate.cases import case_job
from hpcmem.validate.oracle_data import scored_as_traced
from hpcmem.validate.reserved import report_reserved
from hpcmem.validate.table import median, quantile


@dataclass(frozen=True, kw_only=True)
class CaseResult:
    case_id: str
    trainer: str
    technique: str
    estimated: int
    traced: int
    seconds: float
    record: dict

    @property
    def err_pct(self) -> float:
        return 100.0 * (self.estimated - self.traced) / self.traced


def load_cases(path: str | Path, *, ci_only: bool = False) -> list[dict[str, Any]]:
    data = read_yaml(path)
    cases = data.get("cases")
    if not isinstance(cases, list) or not cases:
        raise HpcmemError(f"{path}: expected a `cases:` list of mappings")
    defaults = data.get("defaults") or {}
    out, seen = [], set()
    for i, case in enumerate(cases):
        if not isinstance(case, dict) or "id" not in case or "trainer" not in case:
            raise HpcmemError(f"{path}: case #{i + 1} needs an `id` and a `trainer`")
        if case["id"] in seen:
            raise HpcmemError(f"{path}: duplicate case id {case['id']!r}")
        seen.add(case["id"])
        if ci_only and not case.get("ci"):
            continue
        out.append({**defaults, **case})
    return out


# Case keys that are not job settings: `trace_generation: true` runs transformers' generate to full length in the
# trace (GRPO/RLOO; slow, so only for cases whose generation phase matters).
def _trace_one(task: tuple[dict[str, Any], bool, str | None]) -> dict[str, Any]:
    """Worker: trace one case (imports torch lazily, once per worker process); with `reserved`, the allocator model
    replays its device stream in both modes (and the stream is kept in `events_dir` when given). A case that fails is
    returned with its error, so one bad case never costs the rest of the matrix."""
    case, reserved, events_dir = task
    start = time.perf_counter()
    try:
        r = run_trace(case_job(case), kernels="cuda", generation=bool(case.get("trace_generation")),
                      allocator="both" if reserved else False)
        result = r.to_json()
        if reserved and events_dir:
            save(Path(events_dir) / f"{case['id']}.json.gz", {"case": case}, r.events or [])
    except Exception as exc:  # noqa: BLE001 — reported per case by the caller
        return {"case": case, "error": f"{type(exc).__name__}: {exc}"[:500], "seconds": time.perf_counter() - start}
    return {"case": case, "trace": result, "seconds": time.perf_counter() - start}


def _result(done: dict[str, Any]) -> CaseResult:
    case = done["case"]
    job = scored_as_traced(case_job(case))       # the trace's rows, as a length profile of them would tell it
    full = estimate(job)
    est = full.to_json()
    # the trace sees tensors only: compare it with the estimate's tensor peak (cuBLAS workspaces left out)
    est["per_gpu"]["peak_allocated_bytes"] = max(tensor_bytes(p) for p in full.phases)
    job_dict = {"train": {"trainer": job.train.trainer, **{k: getattr(job.train, k) for k in (
        "use_peft", "load_in_4bit", "load_in_8bit", "gradient_checkpointing", "gradient_checkpointing_kwargs",
        "packing", "packing_strategy", "padding_free", "activation_offloading")}}, "parallel": {}}
    trainer, technique = cell_of(job_dict)
    traced = done["trace"]["per_gpu"]["peak_allocated_bytes"]
    record = {"case": case, "cell": f"{trainer}/{technique}", "estimated": est["per_gpu"]["peak_allocated_bytes"],
              "estimated_phase": est["per_gpu"]["phase"], "traced": traced,
              "traced_phase": done["trace"]["per_gpu"]["phase"], "traced_components": done["trace"]["per_gpu"][
                  "components"], "versions": done["trace"].get("trace", {}).get("versions", {}),
              "seconds": round(done["seconds"], 2)}
    reserved = done.get("reserved") or model_reserved(done["trace"].get("trace", {}).get("allocator"))
    if reserved:
        record["reserved"] = reserved
    return CaseResult(case_id=str(case["id"]), trainer=trainer, technique=technique,
                      estimated=est["per_gpu"]["peak_allocated_bytes"], traced=traced, seconds=done["seconds"],
                      record=record)


def model_reserved(allocator: dict[str, dict[str, Any]] | None) -> dict[str, int] | None:
    """The allocator model's reserved peak per mode (cuBLAS workspaces included), from a trace's allocator stats."""
    if not allocator:
        return None
    return {mode: int(st["peak_reserved_bytes"]) for mode, st in allocator.items()}


def rescore(path: Path) -> list[CaseResult]:
    """Re-estimate the cases of a records file against their stored traces (no tracing: seconds, not minutes)."""
    results = []
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        done = {"case": rec["case"], "seconds": rec.get("seconds", 0.0), "reserved": rec.get("reserved"),
                "trace": {"per_gpu": {"peak_allocated_bytes": rec["traced"], "phase": rec["traced_phase"],
                                      "components": rec.get("traced_components", {})},
                          "trace": {"versions": rec.get("versions", {})}}}
        results.append(_result(done))
    return sorted(results, key=lambda r: r.case_id)


@contextlib.contextmanager
def trace_pool(workers: int = 2) -> Iterator[Any]:
    """The worker processes cases are traced in (spawn: torch and TRL are imported once per worker, ~10 s each, so
    one pool serves every case file of a run). A worker is replaced after 8 cases, which bounds what one process can
    accumulate over a long matrix."""
    import multiprocessing as mp

    n = max(1, workers)
    with mp.get_context("spawn").Pool(processes=n, maxtasksperchild=8, initializer=share_cpus, initargs=(n,)) as pool:
        yield pool


def queue_cases(cases: list[dict[str, Any]], pool: Any) -> Iterator[dict[str, Any]]:
    """Queue every case on `pool` (an open `trace_pool`) now; their traces come back in case order as the returned
    iterator is read, so a caller can queue several files at once and the workers never wait between files."""
    return pool.imap(_trace_one, [(case, False, None) for case in cases])


def run_cases(cases: list[dict[str, Any]], *, workers: int = 2, progress: Progress | None = None,
              records: Path | None = None, reserved: bool = False, events_dir: str | None = None,
              append: bool = False, pool: Any = None, queued: Iterator[dict[str, Any]] | None = None,
              ) -> list[CaseResult]:
    """Trace every case (in `pool`, an open `trace_pool`, or else in a fresh one of `workers` processes; or read
    their traces from `queued`, what `queue_cases` returned for them) and compare with the estimate. With `records`,
    each finished case is appended at once (a long matrix keeps what it measured if it is stopped); failures raise
    at the end, listed. `progress` (hpcmem.progress) hears of every finished case. `reserved`: replay the allocator
    model too (hpcmem.validate.reserved scores the estimate's reserved peak)."""
    if pool is None and queued is None:
        with trace_pool(workers) as own:
            return run_cases(cases, progress=progress, records=records, reserved=reserved, events_dir=events_dir,
                             append=append, pool=own)
    results: list[CaseResult] = []
    failures: list[str] = []
    if records is not None:
        records.parent.mkdir(parents=True, exist_ok=True)
        if not append:
            records.write_text("")
    if queued is None:
        queued = pool.imap_unordered(_trace_one, [(case, reserved, events_dir) for case in cases])
    for done in queued:
        if "error" in done:
            failures.append(f"{done['case']['id']}: {done['error']}")
            if progress:
                progress.note(f"{done['case']['id']} FAILED: {done['error']}")
                progress.advance()
            continue
        res = _result(done)
        results.append(res)
        if records is not None:
            with records.open("a") as fh:
                fh.write(json.dumps(res.record, sort_keys=True) + "\n")
        if progress:
            progress.advance(detail=_detail(res))
    if failures:
        raise SpecError([f"{len(failures)} of {len(cases)} cases could not be traced:", *failures])
    return sorted(results, key=lambda r: r.case_id)


def cell_table(results: list[CaseResult]) -> list[dict[str, Any]]:
    cells: dict[tuple[str, str], list[float]] = {}
    for r in results:
        cells.setdefault((r.trainer, r.technique), []).append(r.err_pct)
    cells[("all", "all")] = [r.err_pct for r in results]
    rows = []
    for (trainer, technique), errs in sorted(cells.items(), key=lambda kv: (kv[0][0] == "all", kv[0])):
        abs_errs = [abs(e) for e in errs]
        rows.append({"trainer": trainer, "technique": technique, "n": len(errs), "median_abs_err_pct": median(abs_errs),
                     "p95_abs_err_pct": quantile(abs_errs, 0.95), "max_abs_err_pct": max(abs_errs),
                     "bias_pct": sum(errs) / len(errs)})
    return rows


def render_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| trainer | technique | n | median abs err % | p95 | max | bias % |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['trainer']} | {r['technique']} | {r['n']} | {r['median_abs_err_pct']:.2f} | "
                     f"{r['p95_abs_err_pct']:.2f} | {r['max_abs_err_pct']:.2f} | {r['bias_pct']:+.2f} |")
    return "\n".join(lines)


def write_records(results: list[CaseResult], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(r.record, sort_keys=True) + "\n" for r in results))
    tmp.replace(path)


def worst(results: list[CaseResult], k: int = 3) -> list[CaseResult]:
    return sorted(results, key=lambda r: abs(r.err_pct), reverse=True)[:k]


def _detail(r: CaseResult) -> str:
    return (f"{r.case_id:<40} est {r.estimated / 2**30:8.2f} GiB  trace {r.traced / 2**30:8.2f} GiB  "
            f"err {r.err_pct:+6.2f} %  ({r.seconds:.1f} s)")


def _trace_reserved(chosen: list[dict[str, Any]], records: Path, *, pool: Any, events_dir: str | None,
                    progress: Progress) -> list[CaseResult]:
    """Trace with the allocator model, resumably: finished cases go to <records>.partial.jsonl at once and a run
    started again traces only the cases not there yet; when every case is done the records file is replaced."""
    partial = records.with_name(records.stem + ".partial.jsonl")
    done = {json.loads(line)["case"]["id"] for line in partial.read_text().splitlines()} if partial.is_file() else set()
    todo = [c for c in chosen if c["id"] not in done]
    progress.note(f"{len(chosen) - len(todo)} of {len(chosen)} cases already traced with the allocator model")
    if len(todo) < len(chosen):
        progress.advance(len(chosen) - len(todo))
    run_cases(todo, pool=pool, progress=progress, records=partial, reserved=True, events_dir=events_dir, append=True)
    wanted = {c["id"] for c in chosen}
    results = [r for r in rescore(partial) if r.case_id in wanted]
    write_records(results, records)
    partial.unlink()
    return results


def run(*, cases: str | None = None, ci_only: bool = False, workers: int = 2, as_json: bool = False,
        write: bool = True, rescore_only: bool = False, reserved: bool = False, events_dir: str | None = None,
        only: tuple[str, ...] = (), **_ignored) -> list[dict[str, Any]]:
    """CLI entry: run the matrix (or re-estimate stored traces), write records and estimator/ACCURACY-trace.md,
    print the table. `reserved`: trace with the allocator model (or, with `rescore_only`, read its stored numbers)
    and print the estimate's reserved peak against it as well (hpcmem.validate.reserved). `only`: trace these case
    ids again, each record replacing its stored one (`retrace`)."""
    if only:
        return retrace(only, cases=cases, workers=workers, as_json=as_json)
    import click

    root = estimator_dir()
    paths = [Path(cases)] if cases else sorted((root / "cases").glob("*.yaml"))
    all_results: list[CaseResult] = []
    with contextlib.ExitStack() as stack:
        pool = None if rescore_only or not paths else stack.enter_context(trace_pool(workers))    # one for all files
        for path in paths:
            records = root / "traces" / f"{path.stem}{'-ci' if ci_only else ''}.jsonl"
            if rescore_only:
                if not records.is_file():
                    raise HpcmemError(f"no stored traces at {records}; run without --rescore first")
                results = rescore(records)
                if write:
                    write_records(results, records)       # the stored traces with today's estimates
            else:
                chosen = load_cases(path, ci_only=ci_only)
                if not chosen:
                    continue
                with Progress(len(chosen), f"{path.name} ({workers} workers)", enabled=not as_json) as bar:
                    if reserved and write:
                        results = _trace_reserved(chosen, records, pool=pool, events_dir=events_dir, progress=bar)
                    else:
                        results = run_cases(chosen, pool=pool, progress=bar, records=records if write else None,
                                            reserved=reserved, events_dir=events_dir)
                        if write:
                            write_records(results, records)       # sorted by case id
            all_results += results
    if not all_results:
        raise HpcmemError("no cases to run (estimator/cases/*.yaml, or --cases FILE)")
    rows = cell_table(all_results)
    if write and not ci_only:
        # the published report always covers every stored matrix, whichever files this run traced
        write_report(root)
    if reserved:
        report_reserved(all_results, as_json=as_json, write=write and not ci_only and not cases)
        return rows
    if as_json:
        click.echo(json.dumps({"cells": rows, "cases": [r.record for r in all_results]}, indent=1))
    else:
        click.echo(render_table(rows))
        for r in worst(all_results):
            click.echo(f"largest: {r.case_id} {r.err_pct:+.2f} % (estimate phase {r.record['estimated_phase']}, "
                       f"trace phase {r.record['traced_phase']})")
    return rows


def write_report(root: Path) -> list[dict[str, Any]]:
    """estimator/ACCURACY-trace.md over every stored matrix (not the CI subsets), whichever files a run traced; the
    cell table it holds."""
    stored = [r for f in sorted((root / "traces").glob("*.jsonl")) if not f.stem.endswith("-ci") for r in rescore(f)]
    rows = cell_table(stored)
    (root / "ACCURACY-trace.md").write_text(report_markdown(rows, stored))
    return rows


def retrace(ids: tuple[str, ...], *, cases: str | None = None, workers: int = 2, as_json: bool = False
            ) -> list[dict[str, Any]]:
    """Trace the named cases again, each with the allocator model when its file's stored records carry reserved
    peaks, and put each record in the place of the stored one (the file's other records kept, re-estimated);
    ACCURACY-trace.md rewritten. An id no case file names is refused before anything runs."""
    import click

    root = estimator_dir()
    paths = [Path(cases)] if cases else sorted((root / "cases").glob("*.yaml"))
    chosen = {p: [c for c in load_cases(p) if c["id"] in ids] for p in paths}
    missing = sorted(set(ids) - {c["id"] for found in chosen.values() for c in found})
    if missing:
        raise HpcmemError(f"--only: no case file names {', '.join(missing)}")
    done: list[CaseResult] = []
    with trace_pool(workers) as pool:
        for path, found in chosen.items():
            if not found:
                continue
            records = root / "traces" / f"{path.stem}.jsonl"
            stored = rescore(records) if records.is_file() else []
            with_model = any("reserved" in r.record for r in stored)
            with Progress(len(found), f"{path.name}: {len(found)} cases again", enabled=not as_json) as bar:
                new = run_cases(found, pool=pool, progress=bar, reserved=with_model)
            fresh = {r.case_id for r in new}
            write_records(sorted([r for r in stored if r.case_id not in fresh] + new, key=lambda r: r.case_id),
                          records)
            done += new
    rows = write_report(root)
    if as_json:
        click.echo(json.dumps({"cases": [r.record for r in done]}, indent=1))
    else:
        for r in done:
            click.echo(f"{r.case_id}: traced {r.traced / 2**30:.2f} GiB, estimate {r.err_pct:+.2f} %")
    return rows


def report_markdown(rows: list[dict[str, Any]], results: list[CaseResult]) -> str:
    versions = next((r.record["versions"] for r in results if r.record.get("versions")), {})
    head = ("# Accuracy of the estimate against the trace (allocated peak)\n\n"
            "Produced by `hpcmem validate trace` (all of estimator/cases/*.yaml, `--kernels cuda` "
            "mapping). err % = 100·(estimate − trace)/trace.\n\n"
            f"Versions: {', '.join(f'{k} {v}' for k, v in sorted(versions.items()))}\n\n")
    tail = "\n\nLargest errors:\n\n" + "\n".join(
        f"- {r.case_id}: {r.err_pct:+.2f} % (estimate phase {r.record['estimated_phase']}; trace phase "
        f"{r.record['traced_phase']})" for r in worst(results, 5)) + "\n"
    return head + render_table(rows) + tail

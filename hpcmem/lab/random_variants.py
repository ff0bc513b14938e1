"""Stored random jobs with one setting changed, traced afresh and scored: a check of new work on jobs it was not
built on.

    python -m hpcmem.lab.random_variants --set activation_offloading=true --sample 25 --seed 17 \\
        --trainer sft --gc --learned --new-types

picks stored trace records (estimator/random/trace.jsonl) that both ran and were scored (within, over 3 % or
outside the held range), at most one per model type; `--new-types` skips every type that already has a stored job
with the changed settings (so none of the types a change was studied on); `--types` keeps the named ones. Each
picked job gets the settings of `--set` (JSON values), is traced as the random run traces
(hpcmem.validate.random_trace `trace_record`) under the id `<id>+` and scored against today's estimate (`score`).
Prints one JSON row per job and the counts; with `--write FILE` it appends each traced record to FILE too (a records
file `python -m hpcmem.lab.random_touched --score FILE` scores again after a change), else it writes nothing.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from hpcmem.validate.random_run import load, records_path
from hpcmem.validate.random_trace import WITHIN_PCT, score, trace_record

SCORED = ("within 3 %", "over 3 %", "outside held range")    # the stored job ran both ways


def pick(recs: list[dict[str, Any]], changes: dict[str, Any], n: int, seed: int, *, trainer: str | None,
         gc: bool, learned: bool, new_types: bool, types: set[str] | None = None) -> list[dict[str, Any]]:
    scored = {r["id"]: score(r) for r in recs}
    changed_types = {r["job"]["model_type"] for r in recs
                     if all(r["job"]["settings"].get(k) == v for k, v in changes.items())}
    out: dict[str, dict[str, Any]] = {}
    order = list(recs)
    random.Random(seed).shuffle(order)
    for r in order:
        j, s = r["job"], scored[r["id"]]
        st = j["settings"]
        if (s.get("verdict") not in SCORED or (trainer and j["trainer"] != trainer)
                or (types is not None and j["model_type"] not in types)
                or (gc and not st.get("gradient_checkpointing"))
                or (gc and (st.get("gradient_checkpointing_kwargs") or {}).get("use_reentrant"))
                or (learned and s["estimate"].get("made") == "derived")
                or (new_types and j["model_type"] in changed_types)
                or any(st.get(k) == v for k, v in changes.items()) or j["model_type"] in out):
            continue
        out[j["model_type"]] = r
        if len(out) == n:
            break
    return list(out.values())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hpcmem.lab.random_variants", description=__doc__.split("\n")[0])
    ap.add_argument("--set", action="append", required=True, metavar="KEY=JSON", help="a setting to change")
    ap.add_argument("--sample", type=int, default=20, help="jobs (one per model type)")
    ap.add_argument("--seed", type=int, default=17)
    ap.add_argument("--trainer")
    ap.add_argument("--gc", action="store_true", help="only jobs with non-reentrant checkpointing")
    ap.add_argument("--learned", action="store_true", help="only learned types")
    ap.add_argument("--new-types", action="store_true", help="skip types with a stored job of these settings")
    ap.add_argument("--types", help="only these model types (comma-separated)")
    ap.add_argument("--write", type=Path, metavar="FILE", help="append each traced record to FILE (JSON lines)")
    args = ap.parse_args(argv)
    if args.sample < 1:
        ap.error(f"--sample {args.sample}: at least 1 job")
    changes = {}
    for item in args.set:
        key, _, value = item.partition("=")
        try:
            changes[key] = json.loads(value)
        except json.JSONDecodeError:
            ap.error(f"--set {item!r}: the value must be JSON (true, 3, \"bfd\")")

    out = None
    if args.write:
        try:
            out = args.write.open("a")     # opened before any trace: a path it cannot write is refused at once
        except OSError as exc:
            ap.error(f"--write {args.write}: cannot append to it ({exc.strerror or exc})")

    def traced() -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
        for rec in pick([r for r in load(records_path("trace")) if r.get("job")], changes, args.sample, args.seed,
                        trainer=args.trainer, gc=args.gc, learned=args.learned, new_types=args.new_types,
                        types=set(args.types.split(",")) if args.types else None):
            job = copy.deepcopy(rec["job"])
            job["settings"].update(changes)
            job["id"] = f"{rec['id']}+"
            record = trace_record(job)
            if out is not None:
                out.write(json.dumps(record) + "\n")
                out.flush()
            yield job, score(record)

    try:
        print_scored(traced())
    finally:
        if out is not None:
            out.close()
    return 0


def print_scored(scored: Iterable[tuple[dict[str, Any], dict[str, Any]]]) -> None:
    """One JSON row per (job, its `score`) as it comes, then the counts on stderr."""
    rows = []
    for job, got in scored:
        row = {"id": job["id"], "trainer": job["trainer"], "model_type": job["model_type"], "verdict": got["verdict"],
               "allocated_err_pct": got.get("err_pct"), "reserved_err_pct": got.get("reserved_err_pct")}
        rows.append(row)
        print(json.dumps(row), flush=True)
    ran = [r for r in rows if r["allocated_err_pct"] is not None]
    within = [r for r in ran if abs(r["allocated_err_pct"]) <= WITHIN_PCT]
    both = [r for r in within if abs(r["reserved_err_pct"] or 0) <= WITHIN_PCT]
    print(f"{len(rows)} jobs, {len(ran)} scored: allocated within {WITHIN_PCT:g} % {len(within)}, both peaks "
          f"{len(both)}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())

"""`hpcmem validate random`: N random jobs (hpcmem.validate.random_jobs) held to an oracle, resumably.

Records: one JSON line per job appended to estimator/random/<oracle>.jsonl as it finishes; a run skips the ids already
there. A record whose job is no longer today's draw of its id (stale: drawn by an hpcmem that covered other types) stays
the evidence of the job it ran and is reported as stale; `redraw` runs the stale ones again in place. The trace and trainer oracles run each job in a worker process (spawn: torch imported once per worker), which a
job that runs past JOB_TIMEOUT_S is killed with (recorded `trace failed: timeout`) and which is replaced every
RECYCLE jobs, so a long run holds no more memory than a short one. The trainer oracle is
hpcmem.validate.random_trainer.run_one(job) -> dict, where installed.
"""

from __future__ import annotations

import importlib.util
import json
import multiprocessing as mp
import queue
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpcmem.datapath import estimator_dir
from hpcmem.errors import HpcmemError
from hpcmem.validate.random_jobs import RandomJob, draw, frozen_streams, model_types, streams_path
from hpcmem.validate.random_props import properties_record
from hpcmem.validate.random_trace import trace_record

ORACLES = ("trace", "trainer", "properties")
RECYCLE = 50
MAX_JOBS = 1_000_000       # a bound on --n: the ids of a run are listed before it starts
JOB_TIMEOUT_S = 240          # ~4× the slowest trace the caps aim at (60 s) on two shared cores
TRAINER_MODULE = "hpcmem.validate.random_trainer"


def records_path(oracle: str) -> Path:
    return estimator_dir() / "random" / f"{oracle}.jsonl"


def freeze_stream(seed: int) -> None:
    """Write this install's types for `seed` into estimator/random/streams.json unless the seed has them already
    (hpcmem.validate.random_jobs: a seed's stream is frozen at its first run); other seeds' lists are kept as they
    are."""
    frozen = frozen_streams()
    if str(seed) in frozen:
        return
    usable, derived = model_types()
    path = streams_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({**frozen, str(seed): {"usable": list(usable), "derived": list(derived)}}, indent=1)
                   + "\n", encoding="utf-8")
    tmp.replace(path)
    frozen_streams.cache_clear()


def load(path: Path) -> list[dict[str, Any]]:
    """The records of a records file, one JSON object per line; a file that is not that is refused in one line."""
    if not path.is_file():
        return []
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise HpcmemError(f"--records {path}: not UTF-8 text (byte {exc.start}): a records file holds one JSON "
                          "object per line") from None
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise HpcmemError(f"--records {path}: line {n} is not JSON ({exc.msg}): a records file holds one JSON "
                              "object per line") from None
        if not isinstance(rec, dict) or not isinstance(rec.get("id"), str):
            raise HpcmemError(f"--records {path}: line {n} is no record (a JSON object with an \"id\")")
        out.append(rec)
    return out


def oracle_task(oracle: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The worker function of an oracle (module-level, so a spawned worker can import it by name)."""
    if oracle == "trace":
        return trace_record
    if oracle == "trainer":
        if importlib.util.find_spec(TRAINER_MODULE) is None:
            raise HpcmemError("--oracle trainer: trainer oracle not installed (hpcmem/validate/random_trainer.py)")
        module = importlib.import_module(TRAINER_MODULE)
        return lambda job: _trainer_record(module.run_one, job)
    if oracle == "properties":
        return properties_record
    raise HpcmemError(f"--oracle {oracle!r}: one of {', '.join(ORACLES)}")


def _trainer_record(run_one: Callable[[Any], dict[str, Any]], job_dict: dict[str, Any]) -> dict[str, Any]:
    return {"id": job_dict["id"], "job": job_dict, **run_one(RandomJob.from_dict(job_dict))}


def _worker(oracle: str, tasks: Any, results: Any) -> None:
    task = oracle_task(oracle)
    while True:
        item = tasks.get()
        if item is None:
            return
        seed, index, job = item
        if job is None:
            try:
                job = draw(seed, index).to_dict()
            except Exception as exc:  # noqa: BLE001 — a job that cannot be drawn is a record too
                results.put({"id": f"s{seed}-{index}", "outcome": f"draw failed: {type(exc).__name__}: {exc}"[:400]})
                continue
        results.put(task(job))


class _Worker:
    """One worker process with its queues; `ask` hands it a job and waits at most `timeout` seconds."""

    def __init__(self, oracle: str) -> None:
        ctx = mp.get_context("spawn")
        self.tasks, self.results = ctx.Queue(), ctx.Queue()
        self.proc = ctx.Process(target=_worker, args=(oracle, self.tasks, self.results), daemon=True)
        self.proc.start()
        self.done = 0

    def ask(self, seed: int, index: int, timeout: float, job: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """The record of job `index` of stream `seed`: `job` when given (a stored record's), else today's draw."""
        self.tasks.put((seed, index, job))
        self.done += 1
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                return self.results.get(timeout=1.0)
            except queue.Empty:
                if not self.proc.is_alive():
                    return None
        return None

    def stop(self, *, kill: bool = False) -> None:
        if kill:
            self.proc.kill()
        else:
            self.tasks.put(None)
        self.proc.join(timeout=30)
        if self.proc.is_alive():
            self.proc.kill()


def run(oracle: str, n: int, seed: int, *, records: Path | None = None, timeout: float = JOB_TIMEOUT_S,
        progress: bool = True, only: tuple[int, ...] = (), redraw: bool = False) -> list[dict[str, Any]]:
    """Jobs s{seed}-0 … s{seed}-{n-1} not yet in `records`, each appended as it finishes; returns the new records.
    `only`: exactly these indices, run again whether recorded or not, each record replacing the stored one in place:
    the job its record holds (the job that ran, even where today's draw of the id differs — a fix to the oracle or to
    hpcmem is scored on the same jobs), else today's draw. `redraw`: the stale records of s{seed}-0 … s{seed}-{n-1}
    too, each replacing its record with today's draw of its id."""
    if not 1 <= n <= MAX_JOBS:
        raise HpcmemError(f"--n {n}: the number of random jobs must be 1 to {MAX_JOBS:,} (each is a trace or a "
                          "trainer run of seconds to minutes)")
    oracle_task(oracle) if oracle == "trainer" else None        # "not installed" before any worker starts
    path = records or records_path(oracle)
    path.parent.mkdir(parents=True, exist_ok=True)
    # the project's records (named or not: the CLI names its default): their seed's types are frozen beside them; a
    # records file of the user's own leaves the project's streams.json as it is
    if Path(path).resolve() == records_path(oracle).resolve():
        freeze_stream(seed)
    ids = {f"s{seed}-{i}" for i in range(n)}
    records = load(path)
    stored = [r for r in records if r["id"] in ids]
    jobs = {r["id"]: r["job"] for r in records if "job" in r} if only else {}
    stale = set() if only else set(stale_ids(stored))
    done = {r["id"] for r in stored} - (stale if redraw else set())
    todo = list(dict.fromkeys(only)) or [i for i in range(n) if f"s{seed}-{i}" not in done]
    note = ("" if not stale else f"; {len(stale)} stale records (no longer today's draw of their id) run again in "
            "place" if redraw else f"; {len(stale)} of them stale (no longer today's draw of their id: --redraw runs "
            "them again)")
    _say(progress, f"validate random --oracle {oracle}: {len(todo)} jobs to run again, each replacing its record in "
                   f"{path}" if only else f"validate random --oracle {oracle}: {len(todo)} of {n} jobs to run "
                   f"({n - len(todo)} recorded in {path}{note})")
    out: list[dict[str, Any]] = []
    worker: _Worker | None = None
    start = time.monotonic()
    try:
        for k, index in enumerate(todo, 1):
            if worker is None or worker.done >= RECYCLE:
                if worker is not None:
                    worker.stop()
                worker = _Worker(oracle)
            t0 = time.monotonic()
            rec = worker.ask(seed, index, timeout, jobs.get(f"s{seed}-{index}"))
            if rec is None:
                alive = worker.proc.is_alive()
                worker.stop(kill=True)
                worker = None
                what = f"timeout after {timeout:.0f} s" if alive else "the worker died (out of memory?)"
                rec = {"id": f"s{seed}-{index}", "outcome": f"trace failed: {what}",
                       "seconds": round(time.monotonic() - t0, 1)}
            _store(path, rec, replace=bool(only) or rec["id"] in stale)
            out.append(rec)
            _say(progress, f"[{k}/{len(todo)}] {rec['id']} {_brief(rec)} ({time.monotonic() - t0:.1f} s, "
                           f"{time.monotonic() - start:.0f} s in all)")
    finally:
        if worker is not None:
            worker.stop()
    return out


def stale_ids(records: list[dict[str, Any]]) -> list[str]:
    """Ids of the records whose stored job is no longer today's draw of their id (records without a job — a trace
    that failed before its job was laid out — are not judged)."""
    out = []
    for rec in records:
        seed, _, index = rec["id"][1:].partition("-")
        if "job" in rec and draw(int(seed), int(index)).to_dict() != rec["job"]:
            out.append(rec["id"])
    return out


def _store(path: Path, rec: dict[str, Any], *, replace: bool) -> None:
    """Append the record, or put it in the place of the stored record of its id (appended where there is none)."""
    line = json.dumps(rec, sort_keys=True, default=str)
    if not replace:
        with path.open("a") as fh:
            fh.write(line + "\n")
        return
    lines = [ln for ln in path.read_text().splitlines() if ln.strip()] if path.is_file() else []
    at = next((k for k, ln in enumerate(lines) if json.loads(ln).get("id") == rec["id"]), None)
    if at is None:
        lines.append(line)
    else:
        lines[at] = line
    path.write_text("".join(ln + "\n" for ln in lines))


def parse_only(text: str, seed: int) -> tuple[int, ...]:
    """`--only s1-62,s1-583` (or bare indices 62,583) → the indices, each of the stream `seed`."""
    out = []
    for item in (x.strip() for x in text.split(",") if x.strip()):
        bare = item.removeprefix(f"s{seed}-")
        if not bare.isdigit():
            raise HpcmemError(f"--only {item!r}: an id of this stream (s{seed}-<index>) or an index")
        out.append(int(bare))
    if not out:
        raise HpcmemError(f"--only {text!r}: no id given")
    return tuple(out)


def _brief(rec: dict[str, Any]) -> str:
    job = rec.get("job") or {}
    head = f"{job.get('trainer', '?')} {job.get('model_type', '?')}"
    if "outcome" in rec:
        return f"{head}: {rec['outcome'][:120]}"
    if "trace" in rec:
        return f"{head}: traced {rec['trace']['peak_allocated_bytes'] / 2**30:.2f} GiB" + (
            f" (hpcmem refuses: {rec['hpcmem_refused'][:60]})" if "hpcmem_refused" in rec else "")
    return f"{head}: {str(rec.get('verdict') or rec.get('failures') or 'done')[:120]}"


def _say(enabled: bool, line: str) -> None:
    if enabled:
        print(line, file=sys.stderr, flush=True)

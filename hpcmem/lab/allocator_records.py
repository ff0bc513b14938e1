"""The allocator model against GPU records: trace each probe record's job, replay its device stream through the
caching-allocator model, compare with the reserved peak the GPU measured.

    python -m hpcmem.lab.allocator_records --trace [--only CASE,...]   # record streams (minutes per big model)
    python -m hpcmem.lab.allocator_records [--markdown]                 # replay + table (seconds)

`--trace` runs `run_trace(job, allocator=..., steps=3)` for every scored record of `--records` (status ok, not
excluded; the job and allocator setting are the record's own) whose stream is not stored yet, and writes it to
`--events/<case>.json.gz` (resumable: stop it and start again). Three steps, because the probe runs three and reads
the peaks of steps 2–3 (hpcmem.probe.runner, warmup_steps=1); the replay reads the same steps.

The table: measured allocated / reserved (torch.cuda.memory_stats peaks) next to the model's, err % =
100·(model − measured)/measured; "slack" = reserved − allocated of each.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hpcmem.trace.trainer as builders
from hpcmem.estimate.workspaces import HOPPER_BYTES
from hpcmem.record import expandable_in_env, job_from_dict
from hpcmem.record import read_lines as read_records
from hpcmem.trace import pref, rl, run_trace
from hpcmem.trace.events import load, save, step_of
from hpcmem.trace.replay import CUBLASLT_WORKSPACE_BYTES, Workspaces, replay, steady_peak
from hpcmem.validate.table import median, quantile

ROOT = Path(__file__).resolve().parents[2]
RECORDS = ROOT / "estimator" / "probes" / "nvidia-h200.jsonl"
EVENTS = ROOT / "estimator" / "allocator" / "nvidia-h200"
STEPS = 3
MIB = 1024**2


def scored(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Records the probe table scores: ran to the end, not excluded, named by a matrix case — the first run of each
    case (a stream is stored per case, `<case>.json.gz`; a later lease's repeat of the case has no stream of its own)."""
    seen: set[str] = set()
    out = []
    for r in records:
        if r.get("measured", {}).get("status") == "ok" and not r.get("excluded") and r.get("case") \
                and r["case"] not in seen:
            seen.add(r["case"])
            out.append(r)
    return out


def record_job(rec: dict[str, Any]) -> Any:
    return job_from_dict(rec["job"], rec.get("env"), rec.get("model_config"))


@contextlib.contextmanager
def probe_batches(job: Any, steps: int) -> Iterator[None]:
    """While active, the trace feeds TRL the batches the GPU probe fed it, instead of its worst case every step:
    - the probe's dataset size (hpcmem.probe.fixtures.dataset: GA × world × (steps + 2) micro-batches) and sampler
      (TrainingArguments' defaults: `train_sampling_strategy="random"`, seed 42 — accelerate's SeedableRandomSampler
      permutes with a generator seeded 42), so a padded SFT batch holds a shorter row only in the steps where the
      probe's did (B = 4: steps 1 and 3 of 3, not step 2);
    - DPO: the probe's text rows all reach max_length (no padded row);
    - GRPO/RLOO: the probe forces every completion to max_completion_length (`min_new_tokens`): no shorter one."""
    t = job.train
    micro_batches = t.gradient_accumulation_steps * job.parallel.world_size * (steps + 2)
    saved = (builders.common_args, builders.make_dataset, pref.make_preference_dataset, rl.PAD_COMPLETIONS)
    common_args, make_dataset, make_preference_dataset, _ = saved

    def probe_args(job: Any, output_dir: str | None = None) -> dict[str, Any]:
        return {**common_args(job, output_dir), "train_sampling_strategy": "random", "seed": 42}

    def probe_dataset(design: Any, num_micro_batches: int, vocab_size: int) -> Any:
        return make_dataset(design, micro_batches, vocab_size)

    def probe_preference(job: Any, design: Any, num_micro_batches: int) -> Any:
        if job.train.trainer == "dpo":
            design = dataclasses.replace(design, documents=(design.documents[0],) * len(design.documents))
        return make_preference_dataset(job, design, micro_batches)

    builders.common_args, builders.make_dataset = probe_args, probe_dataset
    pref.make_preference_dataset, rl.PAD_COMPLETIONS = probe_preference, False
    try:
        yield
    finally:
        builders.common_args, builders.make_dataset, pref.make_preference_dataset, rl.PAD_COMPLETIONS = saved


def trace_record(rec: dict[str, Any], out: Path, *, generation: bool = False) -> float:
    """Trace the record's job with the event log on and store the stream; returns the seconds it took."""
    job = record_job(rec)
    start = time.perf_counter()
    with probe_batches(job, STEPS):
        r = run_trace(job, kernels="cuda", allocator="default", steps=STEPS, generation=generation)
    seconds = time.perf_counter() - start
    meta = {"case": rec["case"], "record_id": rec["id"], "steps": STEPS, "generation": generation,
            "expandable": job.expandable_segments,
            "trace_peak_allocated_bytes": r.peak_allocated_bytes, "trace_phase": r.phase,
            "step_peaks": r.step_peaks, "versions": r.versions, "seconds": round(seconds, 1)}
    save(out, meta, r.events or [])
    return seconds


def score(rec: dict[str, Any], stored: dict[str, Any], *, workspaces: Any = None) -> dict[str, Any]:
    """Replay a stored stream in the record's allocator mode; the row of the table."""
    job = record_job(rec)
    r = replay(stored["events"], expandable=job.expandable_segments, workspaces=workspaces or Workspaces())
    m = rec["measured"]
    row = {"case": rec["case"], "trainer": job.train.trainer, "expandable": job.expandable_segments,
           "alloc_gpu": m["peak_allocated_bytes"], "resv_gpu": m["peak_reserved_bytes"],
           "alloc_model": r.steady_allocated_bytes, "resv_model": r.steady_reserved_bytes,
           "step_peaks": {s: list(v) for s, v in sorted(r.step_peaks.items())}}
    row["alloc_err_pct"] = 100.0 * (row["alloc_model"] - row["alloc_gpu"]) / row["alloc_gpu"]
    row["resv_err_pct"] = 100.0 * (row["resv_model"] - row["resv_gpu"]) / row["resv_gpu"]
    return row


def perturbed(events: list[Any], nbytes: int) -> list[Any]:
    """The stream with one more tensor of `nbytes`, allocated after its first event and never freed: the perturbation
    that tells whether a reserved peak depends on where a few MiB sit (in the model, one 2 or 8 MiB tensor moves
    full fine-tuning streams by up to ±6 %: whether step 2 maps the LM head's [V, H] gradient again; estimator/LOG.md).
    Frees name their malloc by a relative offset (hpcmem.trace.events), and the tensor is inserted before every event
    but the first, which is a phase mark, so no offset changes."""
    if nbytes <= 0:
        return events
    if not events or isinstance(events[0], int):
        raise ValueError("a stored stream starts with its phase mark")
    return [events[0], nbytes, *events[1:]]


def cuda_replay(stored: dict[str, Any], *, expandable: bool, perturb: int = 0,
                model: bool = True) -> dict[str, Any]:
    """Re-issue a stored stream on the current CUDA device (`torch.empty` per malloc, `del` per free, a workspace-sized
    `torch.empty` kept at each thread's first GEMM, as replay() adds them) and return torch's peaks per step next to
    the model's: the allocator model checked on the very same stream, apart from how faithful the trace is. The
    process's PYTORCH_CUDA_ALLOC_CONF must match `expandable` (torch reads it once). `perturb`: replay `perturbed`
    streams, on the GPU and in the model alike. `model=False` (--gpu-only) leaves the model's side out ("model": null,
    with the cuBLAS workspace it needs), for `--read` to fill in (`with_models`): on a lease, the GPU's half only."""
    import torch

    cap = torch.cuda.get_device_capability()
    ws = Workspaces(cublas=HOPPER_BYTES if cap == (9, 0) else 4096 * 1024 * 2 + 16 * 1024 * 8)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    live: dict[int, Any] = {}
    kept: list[Any] = []
    taken: set[tuple[str, str]] = set()
    real: dict[int, tuple[int, int]] = {}
    step = 0
    events = perturbed(stored["events"], perturb)
    for i, ev in enumerate(events):
        if isinstance(ev, int):
            if ev >= 0:
                live[i] = torch.empty(ev, dtype=torch.uint8, device="cuda")
            else:
                del live[i + ev]
        elif ev[0] == "phase" and step_of(ev[1]) not in (0, step):
            if step:
                st = torch.cuda.memory_stats()
                real[step] = (st["allocated_bytes.all.peak"], st["reserved_bytes.all.peak"])
            torch.cuda.reset_peak_memory_stats()
            step = step_of(ev[1])
        elif ev[0] == "gemm":
            for name, nbytes in (("cublas", ws.cublas), ("cublaslt", CUBLASLT_WORKSPACE_BYTES if ev[2] == "lt" else 0)):
                if nbytes and (ev[1], name) not in taken:
                    taken.add((ev[1], name))
                    kept.append(torch.empty(nbytes, dtype=torch.uint8, device="cuda"))
    st = torch.cuda.memory_stats()
    real[step] = (st["allocated_bytes.all.peak"], st["reserved_bytes.all.peak"])
    del live, kept
    torch.cuda.empty_cache()
    return {"case": stored.get("case"), "expandable": expandable, "perturb_bytes": perturb, "real": real,
            "cublas_workspace_bytes": ws.cublas,
            "model": replay(events, expandable=expandable, workspaces=ws).step_peaks if model else None}


def with_models(lines: list[dict[str, Any]], events: Path) -> list[dict[str, Any]]:
    """`--cuda-replay --gpu-only` lines completed with the model's side: the same stored stream
    (`events`/<case>.json.gz), perturbation, allocator mode and cuBLAS workspace replayed through the model, as
    `cuda_replay` would have; lines that carry it are kept as they are. ValueError names a line whose stream is not
    stored."""
    out = []
    for n, x in enumerate(lines, 1):
        if x.get("model") is None:
            path = events / f"{x['case']}.json.gz"
            if not path.is_file():
                raise ValueError(f"line {n}: case = {x['case']!r}: no stored stream {path} to replay in the model "
                                 "(--events names the folder)")
            stream = perturbed(load(path)["events"], x.get("perturb_bytes") or 0)
            peaks = replay(stream, expandable=x["expandable"],
                           workspaces=Workspaces(cublas=x["cublas_workspace_bytes"])).step_peaks
            x = {**x, "model": {str(k): list(v) for k, v in peaks.items()}}
        out.append(x)
    return out


def replay_lines(text: str) -> list[dict[str, Any]]:
    """The kit's `--cuda-replay` lines (`cuda_replay`'s objects, one JSON object a line), checked; ValueError names the
    line, the field, its value and what it must be."""
    out = []
    for n, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            x = json.loads(raw)
        except ValueError as exc:
            raise ValueError(f"line {n}: not JSON ({exc})") from None
        if not isinstance(x, dict):
            raise ValueError(f"line {n}: {raw.strip()[:40]!r}: each line must be one --cuda-replay JSON object")
        rules = (("case", lambda v: isinstance(v, str), "a case name"),
                 ("expandable", lambda v: isinstance(v, bool), "true or false"),
                 ("perturb_bytes", lambda v: v is None or _count(v), "a byte count ≥ 0 (absent: 0)"),
                 ("real", _peaks, "{step: [allocated, reserved]} with byte counts ≥ 0"),
                 ("model", lambda v: v is None or _peaks(v),
                  "{step: [allocated, reserved]} with byte counts ≥ 0, or null (a --gpu-only line)"))
        for field, ok, rule in rules:
            if not ok(x.get(field)):
                raise ValueError(f"line {n}: {field} = {json.dumps(x.get(field))[:60]}: must be {rule}")
        if x.get("model") is None and not _count(x.get("cublas_workspace_bytes")):
            raise ValueError(f"line {n}: cublas_workspace_bytes = {json.dumps(x.get('cublas_workspace_bytes'))[:60]}: "
                             "must be a byte count ≥ 0 where model is null (the model replays with it)")
        out.append(x)
    return out


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _peaks(v: Any) -> bool:
    return isinstance(v, dict) and bool(v) and all(
        k.isascii() and k.isdigit() and isinstance(p, list) and len(p) == 2 and all(_count(b) for b in p)
        for k, p in v.items())


def cuda_replay_rows(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The kit's `--cuda-replay` lines as rows: steady reserved peak (steps ≥ 2, as the probe reads them) on the GPU
    and in the model, and for a perturbed replay how far each moved from the same stream's unperturbed replay in the
    same mode (None when that replay is missing). Both moving alike says the model's flip is the allocator's."""
    def steady(peaks: dict[str, Any]) -> int:
        return steady_peak({int(k): tuple(v) for k, v in peaks.items()}, 1)

    base = {(x["case"], x["expandable"]): x for x in lines if not x.get("perturb_bytes")}
    rows = []
    for x in lines:
        gpu, model = steady(x["real"]), steady(x["model"])
        row = {"case": x["case"], "expandable": x["expandable"], "perturb_bytes": x.get("perturb_bytes") or 0,
               "resv_gpu": gpu, "resv_model": model, "err_pct": 100.0 * (model - gpu) / gpu if gpu else None,
               "gpu_moved": None, "model_moved": None}
        b = base.get((x["case"], x["expandable"]))
        if row["perturb_bytes"] and b is not None:
            row["gpu_moved"], row["model_moved"] = gpu - steady(b["real"]), model - steady(b["model"])
        rows.append(row)
    return rows


def table(rows: list[dict[str, Any]], markdown: bool = False) -> str:
    head = ["case", "mode", "alloc GPU", "alloc model", "err %", "resv GPU", "resv model", "err %",
            "slack GPU", "slack model"]
    lines = []
    fmt = "| " + " | ".join(["{}"] * len(head)) + " |" if markdown else \
        "{:<28}{:>6}{:>11}{:>12}{:>8}{:>11}{:>12}{:>8}{:>11}{:>12}"
    lines.append(fmt.format(*head))
    if markdown:
        lines.append("|" + "---|" * len(head))
    for r in rows:
        lines.append(fmt.format(
            r["case"], "exp" if r["expandable"] else "def", f"{r['alloc_gpu'] / MIB:,.0f}",
            f"{r['alloc_model'] / MIB:,.0f}", f"{r['alloc_err_pct']:+.2f}", f"{r['resv_gpu'] / MIB:,.0f}",
            f"{r['resv_model'] / MIB:,.0f}", f"{r['resv_err_pct']:+.2f}", f"{(r['resv_gpu'] - r['alloc_gpu']) / MIB:,.0f}",
            f"{(r['resv_model'] - r['alloc_model']) / MIB:,.0f}"))
    if rows:
        for key in ("alloc_err_pct", "resv_err_pct"):
            errs = [abs(r[key]) for r in rows]
            lines.append(f"{key}: n {len(errs)}, median |err| {median(errs):.2f} %, p95 {quantile(errs, 0.95):.2f} %, "
                         f"max {max(errs):.2f} %, under {sum(r[key] < 0 for r in rows)}")
    lines.append("MiB; err % = 100·(model − GPU)/GPU; slack = reserved − allocated")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hpcmem.lab.allocator_records", description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=Path, default=RECORDS)
    ap.add_argument("--events", type=Path, default=EVENTS, help="folder of stored streams")
    ap.add_argument("--trace", action="store_true", help="trace the records whose stream is not stored yet")
    ap.add_argument("--only", default=None, help="comma-separated case names")
    ap.add_argument("--generation", action="store_true",
                    help="--trace: GRPO/RLOO run transformers' generate to full length, as the probe did (slow)")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--cuda-replay", action="store_true",
                    help="on a CUDA machine: re-issue each stored stream with torch.empty and print torch's peaks "
                         "next to the model's (run once plain, once with PYTORCH_CUDA_ALLOC_CONF="
                         "expandable_segments:True)")
    ap.add_argument("--perturb", default=None,
                    help="--cuda-replay: replay each stream once per size (bytes, comma-separated; 0, the default: "
                         "as stored), with one more tensor of that size allocated before the weights")
    ap.add_argument("--gpu-only", action="store_true",
                    help="--cuda-replay: leave the model's side out of each line (a lease spends its minutes on the "
                         "GPU's half; --read replays the model)")
    ap.add_argument("--read", type=Path, default=None, metavar="JSONL",
                    help="read the kit's --cuda-replay lines (allocator-cuda-replay.jsonl) and print GPU vs model")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = ap.parse_args(argv)
    sizes = [x.strip() for x in args.perturb.split(",")] if args.perturb is not None else ["0"]
    if not all(x.isascii() and x.isdigit() for x in sizes):
        ap.error(f"--perturb {args.perturb!r}: must be byte counts, comma-separated integers ≥ 0 (0: unperturbed)")
    if args.gpu_only and not args.cuda_replay:
        ap.error("--gpu-only: only with --cuda-replay (it leaves the model's side of each replay line out)")
    if args.perturb is not None and not args.cuda_replay:
        ap.error(f"--perturb {args.perturb!r}: only with --cuda-replay (it sizes the tensor the replay adds)")
    if args.read is not None:
        try:
            rows = cuda_replay_rows(with_models(replay_lines(args.read.read_text()), args.events))
        except OSError as exc:
            print(f"--read {args.read}: cannot read it ({exc.strerror or exc})", file=sys.stderr)
            return 2
        except ValueError as exc:       # UnicodeDecodeError included
            print(f"--read {args.read}: not the kit's --cuda-replay lines: {exc}", file=sys.stderr)
            return 2
        if args.json:
            print(json.dumps(rows, indent=1))
            return 0
        for r in rows:
            moved = "" if r["gpu_moved"] is None else \
                f"  moved: GPU {r['gpu_moved'] / MIB:+,.0f}, model {r['model_moved'] / MIB:+,.0f} MiB"
            err = "-" if r["err_pct"] is None else f"{r['err_pct']:+.2f} %"
            print(f"{r['case']:<28} {'exp' if r['expandable'] else 'def'} +{r['perturb_bytes'] / MIB:.0f} MiB  "
                  f"reserved GPU {r['resv_gpu'] / MIB:,.0f} model {r['resv_model'] / MIB:,.0f} MiB ({err}){moved}")
        return 0
    records = scored(read_records(args.records))
    if args.only:
        wanted = set(args.only.split(","))
        records = [r for r in records if r["case"] in wanted]
    if args.trace:
        for i, rec in enumerate(records, 1):
            out = args.events / f"{rec['case']}.json.gz"
            if out.is_file():
                continue
            print(f"[{i}/{len(records)}] tracing {rec['case']} …", file=sys.stderr, flush=True)
            generation = args.generation and rec["job"]["train"]["trainer"] in ("grpo", "rloo")
            seconds = trace_record(rec, out, generation=generation)
            print(f"[{i}/{len(records)}] {rec['case']}: {seconds:.0f} s → {out}", file=sys.stderr, flush=True)
    if args.cuda_replay:
        import torch

        if not torch.cuda.is_available():
            print("--cuda-replay needs a CUDA device (torch.cuda.is_available() is False)", file=sys.stderr)
            return 2

        expandable = expandable_in_env(dict(os.environ))
        paths = [args.events / f"{rec['case']}.json.gz" for rec in records]
        # smallest stream first: a replay the lease's deadline cuts short loses the few long generation streams
        # (GRPO/RLOO: 1–2 M events each), not the many short ones
        for path in sorted(paths, key=lambda p: p.stat().st_size if p.is_file() else 0):
            if path.is_file():
                stream = load(path)
                for nbytes in map(int, sizes):
                    print(json.dumps(cuda_replay(stream, expandable=expandable, perturb=nbytes,
                                                 model=not args.gpu_only)), flush=True)
        return 0
    rows = []
    for rec in records:
        path = args.events / f"{rec['case']}.json.gz"
        if path.is_file():
            rows.append(score(rec, load(path)))
        else:
            print(f"no stored stream for {rec['case']} ({path}); --trace records it", file=sys.stderr)
    print(json.dumps(rows, indent=1) if args.json else table(rows, args.markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())

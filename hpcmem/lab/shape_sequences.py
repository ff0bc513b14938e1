"""Reserved under the batch shapes a real dataset gives: trace N optimizer steps of a padded SFT job whose
micro-batches are drawn from a length profile, and replay the stream through the caching-allocator model with and
without `torch_empty_cache_steps`.

TRL's default collation (trl/trainer/sft_trainer.py `DataCollatorForLanguageModeling`, `pad_to_multiple_of`) pads a
micro-batch to its longest row, so the shape changes every step; the allocator (hpcmem.estimate.caching_allocator)
caches the blocks of one shape and cuts the next shape's requests out of them or maps new segments. The steady
reserved of the constant worst-case batch (`hpcmem trace`) is the reference; what a sequence reserves above it is
the excess the estimate's `shapes` term bounds (hpcmem.estimate.shapes).

    python -m hpcmem.lab.shape_sequences --profile hpcmem/examples/lengths-sft.json --steps 24 --seed 1 \\
        --settings '{"model_name_or_path": "Qwen/Qwen2.5-0.5B", "dtype": "bfloat16", "max_length": 1024}' 

Rows are drawn with replacement from the profile's histogram (seeded), truncated to max_length (SFT truncates), and
handed to the trainer in order (the trace's sampler is sequential), so micro-batch i is rows [i·B, (i+1)·B).
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import itertools
import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hpcmem.data.batches import round_up
from hpcmem.data.profile import load_profile
from hpcmem.datapath import estimator_dir
from hpcmem.estimate import estimate
from hpcmem.estimate.caching_allocator import MODES
from hpcmem.estimate.shapes import CLASSES, GROUPS, batch_bytes, cadence, group
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.trl_config import build_job
from hpcmem.trace.data import BatchDesign
from hpcmem.trace.events import load, save, step_of
from hpcmem.trace.replay import Workspaces, replay
from hpcmem.trace.run import run_trace

GIB = 1024**3
CADENCES: tuple[int | None, ...] = (None, 1, 2, 4)


def draw_rows(histogram: Sequence[Sequence[int]], n: int, seed: int, max_length: int | None) -> list[int]:
    """`n` row lengths drawn with replacement from a profile histogram ([[length, count], …]), cut at max_length."""
    lengths = [int(length) for length, _ in histogram]
    cumulative, total = [], 0
    for _, count in histogram:
        total += int(count)
        cumulative.append(total)
    rng = random.Random(seed)
    rows = [lengths[bisect.bisect_right(cumulative, rng.randrange(total))] for _ in range(n)]
    return [min(r, max_length) if max_length else r for r in rows]


def padded_lengths(rows: Sequence[int], batch: int, multiple: int | None) -> list[int]:
    """The padded length of each micro-batch: its longest row, rounded up to pad_to_multiple_of."""
    return [round_up(max(rows[i:i + batch]), multiple) for i in range(0, len(rows), batch)]


def sequence_design(job: JobSpec, rows: Sequence[int]) -> BatchDesign:
    """A trace design whose documents are the drawn rows of every micro-batch, in order."""
    t = job.train
    widths = padded_lengths(rows, t.per_device_train_batch_size, t.pad_to_multiple_of)
    return BatchDesign("padded, drawn", tuple(rows), (t.per_device_train_batch_size, max(widths)),
                       sum(widths) * t.per_device_train_batch_size,
                       f"{len(widths)} micro-batches drawn from a length profile, padded to {min(widths)}–"
                       f"{max(widths)} tokens")


def constant_job(job: JobSpec, width: int) -> JobSpec:
    """The job with max_length at the sequence's longest shape: the trace's worst batch, repeated."""
    return dataclasses.replace(job, train=dataclasses.replace(job.train, max_length=width))


def reserved_by_step(events: list[Any], workspaces: Workspaces, empty_cache_steps: int | None,
                     expandable: bool = False) -> dict[int, int]:
    """Reserved peak of every step of a stream with the Trainer's empty_cache cadence."""
    r = replay(events, workspaces=workspaces, empty_cache_steps=empty_cache_steps, expandable=expandable)
    return {s: v[1] for s, v in sorted(r.step_peaks.items()) if s}


def excess(events: list[Any], constant_reserved: int, empty_cache_steps: int | None, expandable: bool = False) -> int:
    """Reserved over steps ≥ 2 of a drawn sequence − the constant worst batch's steady reserved (bytes; may be
    negative)."""
    per = reserved_by_step(events, Workspaces(), empty_cache_steps, expandable)
    return max(v for s, v in per.items() if s >= 2) - constant_reserved


def run(job: JobSpec, histogram: Sequence[Sequence[int]], steps: int, seed: int,
        cadences: Sequence[int | None] = CADENCES) -> dict[str, Any]:
    """Trace `steps` drawn steps and the constant batch of their longest shape; reserved per step per cadence."""
    t = job.train
    rows = draw_rows(histogram, steps * t.per_device_train_batch_size * t.gradient_accumulation_steps, seed,
                     t.max_length)
    widths = padded_lengths(rows, t.per_device_train_batch_size, t.pad_to_multiple_of)
    seq = run_trace(job, allocator="default", steps=steps, design=sequence_design(job, rows))
    ws = Workspaces()
    const = run_trace(constant_job(job, max(widths)), allocator="default")
    const_reserved = replay(const.events, workspaces=ws).steady_reserved_bytes
    by_cadence = {str(k): reserved_by_step(seq.events, ws, k) for k in cadences}
    return {"widths": widths, "constant_reserved_bytes": const_reserved,
            "constant_allocated_bytes": const.peak_allocated_bytes, "reserved_by_step": by_cadence,
            "constant_reserved_bytes_expandable": replay(const.events, workspaces=ws,
                                                         expandable=True).steady_reserved_bytes,
            "allocated_peak_bytes": seq.peak_allocated_bytes, "seconds": seq.seconds + const.seconds,
            "events": seq.events}


def step_blocks(events: list[Any]) -> tuple[list[Any], list[list[Any]], list[Any]]:
    """(setup and step 1, one absolute-handle block per step 2 … N−1, step N): mallocs as ("m", id, bytes), frees as
    ("f", id), markers as they are. Step N keeps the end of training (the optimizer states freed)."""
    step, born, blocks = 0, {}, {}
    for i, ev in enumerate(events):
        if isinstance(ev, list) and ev[0] == "phase":
            step = step_of(ev[1]) or step
        item = ev if not isinstance(ev, int) else ("m", i, ev) if ev >= 0 else ("f", i + ev)
        blocks.setdefault(step, []).append(item)
    last = max(blocks)
    head = [x for s in sorted(blocks) if s <= 1 for x in blocks[s]]
    return head, [blocks[s] for s in range(2, last)], blocks[last]


def reordered(events: list[Any], order: Sequence[int]) -> list[Any]:
    """The stream with steps 2 … N−1 in `order` (indices into them) and renumbered: a step's blocks are born and
    freed within it but for a few scalars a later step frees (the logged loss), which are freed at the end of their
    own step here. Steps 1 and N stay first and last."""
    head, middle, tail = step_blocks(events)
    steps = [_own_frees(b) for b in (middle[i] for i in order)]
    items = head + [_renumbered(x, 2 + n) for n, b in enumerate(steps) for x in b] + \
        [_renumbered(x, 2 + len(steps)) for x in tail]
    return _relative(items)


def _own_frees(block: list[Any]) -> list[Any]:
    born = {x[1] for x in block if isinstance(x, tuple) and x[0] == "m"}
    freed = {x[1] for x in block if isinstance(x, tuple) and x[0] == "f"}
    kept = [x for x in block if not (isinstance(x, tuple) and x[0] == "f" and x[1] not in born)]
    return kept + [("f", h) for h in sorted(born - freed)]


def _renumbered(item: Any, step: int) -> Any:
    if isinstance(item, list) and item[0] == "phase" and step_of(item[1]):
        return ["phase", f"step {step} / {item[1].split(' / ', 1)[1]}" if " / " in item[1] else f"step {step}"]
    return item


def _relative(items: list[Any]) -> list[Any]:
    """Absolute handles back to the stream format (hpcmem.trace.events): mallocs by size, frees counting back; a
    free of a handle not born before it (a step-1 or later-step birth freed out of order) is dropped."""
    out: list[Any] = []
    where: dict[int, int] = {}
    for x in items:
        if isinstance(x, tuple) and x[0] == "m":
            where[x[1]] = len(out)
            out.append(x[2])
        elif isinstance(x, tuple):
            if x[1] in where:
                out.append(where.pop(x[1]) - len(out))
        else:
            out.append(x)
    return out


def stream_job(meta: dict[str, Any], empty_cache_steps: int | None, expandable: bool = False) -> JobSpec:
    """The JobSpec of a stored stream's settings with the cadence and allocator mode to replay it under."""
    job = build_job("sft", {**meta["settings"], "torch_empty_cache_steps": empty_cache_steps})[0]
    return dataclasses.replace(job, expandable_segments=expandable)


def survey(stored: dict[str, dict[str, Any]], orders: int, seed: int,
           cadences: Sequence[int | None] = CADENCES) -> list[dict[str, Any]]:
    """Per stored stream, its drawn order and `orders` − 1 seeded shuffles of its steps 2 … N−1 (`reordered`),
    each replayed per allocator mode and cadence: the excess over the constant worst batch and W
    (hpcmem.estimate.shapes.batch_bytes)."""
    rows = []
    for name, data in sorted(stored.items()):
        rng = random.Random(f"{seed}/{name}")         # per stream: fewer orders replay the first ones of more
        n = len(step_blocks(data["events"])[1])
        shuffles = [list(range(n))] + [rng.sample(range(n), n) for _ in range(orders - 1)]
        for mode, k in itertools.product(MODES, cadences):
            job = stream_job(data, k, mode == "expandable")
            w = batch_bytes(estimate(job).phases)
            for i, order in enumerate(shuffles):
                seen = excess(reordered(data["events"], order), constant(data, mode), k, mode == "expandable")
                rows.append({"stream": name, "order": i, "mode": mode, "group": group(job), "cadence": k,
                             "class": cadence(job),
                             "excess_bytes": seen, "batch_bytes": w, "ratio": round(seen / w, 6)})
    return rows


def constant(data: dict[str, Any], mode: str) -> int:
    """The constant worst batch's steady reserved of a stored stream in an allocator mode."""
    return data["constant_reserved_bytes" + ("_expandable" if mode == "expandable" else "")]


def fitted(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """hpcmem.estimate.shapes.COEFFICIENTS from survey rows: the largest ratio per group and cadence class, ≥ 0."""
    return {g: {name: round(max([0.0, *(r["ratio"] for r in rows if (r["group"], r["class"]) == (g, name))]), 4)
                for name in CLASSES} for g in GROUPS}


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", help="trace: the length profile the rows are drawn from")
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", help="trace: write the drawn sequence's stream and what it measured")
    ap.add_argument("--settings", help="trace: the SFT job's TRL settings as a JSON object")
    ap.add_argument("--survey", type=int, metavar="ORDERS",
                    help="replay every stored stream (streams_dir()) in ORDERS step orders instead")
    ap.add_argument("--write", help="survey: write its rows and the fitted coefficients (JSON)")
    a = ap.parse_args(argv)
    if a.survey:
        _survey(a.survey, a.seed, a.write)
        return
    settings = json.loads(a.settings)
    out = run(build_job("sft", settings)[0], load_profile(a.profile)["histogram"], a.steps, a.seed)
    const = out["constant_reserved_bytes"]
    print(f"shapes {out['widths']}; constant worst batch reserved {const / GIB:.2f} GiB")
    for k, per in out["reserved_by_step"].items():
        top = max(v for s, v in per.items() if s >= 2)
        print(f"empty_cache every {k}: reserved peak {top / GIB:.2f} GiB ({(top - const) / GIB:+.2f}); per step "
              + " ".join(f"{v / GIB:.2f}" for v in per.values()))
    if a.out:
        events = out.pop("events")
        save(a.out, {"settings": settings, "profile": a.profile, "seed": a.seed, "steps": a.steps, **out}, events)


def streams_dir() -> Path:
    return estimator_dir() / "allocator" / "shapes"


def stored_streams() -> dict[str, dict[str, Any]]:
    """The shipped streams by name (estimator/allocator/shapes/NAME.json.gz, written by `--out`)."""
    return {p.name.removesuffix(".json.gz"): load(p) for p in sorted(streams_dir().glob("*.json.gz"))}


def _survey(orders: int, seed: int, write: str | None) -> None:
    rows = survey(stored_streams(), orders, seed)
    for r in rows:
        print(f"{r['stream']:<28} {r['mode']:<10} order {r['order']:>2} empty_cache {str(r['cadence']):>4}: "
              f"{r['excess_bytes'] / GIB:+.2f} GiB = {r['ratio']:+.3f} W (W {r['batch_bytes'] / GIB:.2f} GiB)")
    fit = fitted(rows)
    print(f"fitted: {fit}")
    if write:
        Path(write).write_text(json.dumps({"orders": orders, "seed": seed, "coefficients": fit, "rows": rows},
                                          indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()

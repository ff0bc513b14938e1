"""What the GPU holds at its allocated peak that the CPU trace does not: the blocks live then, by size and origin.

    python -m hpcmem.lab.peak_blocks --only dpo-qwen05-lora,... [--out peak-blocks.jsonl]   # on a GPU (seconds)
    python -m hpcmem.lab.peak_blocks --read peak-blocks.jsonl                               # anywhere

On the GPU: runs each H200 record's job as the probe does (hpcmem.probe.runner `measure`, 3 steps) with torch's
allocation history on (`torch.cuda.memory._record_memory_history`, Python stacks), takes `_snapshot()` and keeps the
blocks live at the largest allocated instant: each block's requested size and the innermost frames of trl, peft,
transformers or torch that allocated it; one JSON line per case. `--read` puts the sizes next to the CPU trace's
live tensors at its own peak (the stored stream, estimator/allocator/nvidia-h200/<case>.json.gz; both over the
whole run, as the history covers every step): sizes the GPU holds more of, with their origin, are what the trace
misses. Cases whose steps peak alike (DPO, GRPO, RLOO here) compare cleanly; SFT's step 1 and 3 differ by padding.
Expected among them: the cuBLAS (32 MiB) and cuBLASLt (1 MiB) workspaces, which no trace holds
(hpcmem.estimate.workspaces).

Why: at the backward peak the GPU holds 13.8, 5.2 and 3.5 MiB more than the replayed CPU trace for dpo-qwen05-lora,
grpo-qwen05-lora and rloo-qwen05-lora — one bf16 [rows × seq, H] tensor each (14.0, 5.25, 3.5 MiB) — while SFT on the
same model matches to 0.2 MiB (estimator/LOG.md); the stream alone does not say which tensor.

The history format (torch/cuda/memory.py `_snapshot`, `_record_memory_history`): `device_traces[d]` is a list of
events with `action` (alloc, free_requested, free_completed, segment_alloc, …), `addr`, `size` (the requested bytes)
and `frames`; a block stops counting as allocated at free_completed (c10/cuda/CUDACachingAllocator.cpp `free_block`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from hpcmem.errors import refuse_unreadable
from hpcmem.lab.allocator_records import EVENTS, RECORDS, record_job, scored
from hpcmem.probe import align_allocator
from hpcmem.probe.runner import measure
from hpcmem.trace.events import load, step_of

MIB = 1024**2
LIBS = ("/trl/", "/peft/", "/transformers/", "/torch/")
MAX_ENTRIES = 2_000_000


def origin(frames: list[dict[str, Any]], depth: int = 3) -> str:
    """The innermost `depth` frames from the libraries that allocate training tensors, 'file:line name' each."""
    keep = [f for f in frames if any(lib in f.get("filename", "") for lib in LIBS)][:depth]
    return " < ".join(f"{f['filename'].rsplit('/', 2)[-1]}:{f.get('line', 0)} {f.get('name', '')}" for f in keep)


def live_at_peak(events: list[dict[str, Any]]) -> tuple[int, list[tuple[int, str]]]:
    """(largest sum of requested bytes live at once, [(size, origin)] of the blocks live then). A block is freed at
    free_completed; a history without completed frees (torch versions before them) frees at free_requested."""
    completes = any(e.get("action") == "free_completed" for e in events)
    freed_at = "free_completed" if completes else "free_requested"
    live: dict[int, tuple[int, str]] = {}
    total = best = 0
    best_live: list[tuple[int, str]] = []
    for e in events:
        action = e.get("action")
        if action == "alloc":
            live[e["addr"]] = (e["size"], origin(e.get("frames", [])))
            total += e["size"]
            if total > best:
                best, best_live = total, list(live.values())
        elif action == freed_at and e["addr"] in live:
            total -= live.pop(e["addr"])[0]
    return best, best_live


def trace_live_at_peak(stream: list[Any], first_step: int = 1) -> Counter:
    """Sizes live at the CPU trace's largest instant in steps ≥ `first_step` (requested bytes, as the stream holds);
    step 1 on, as the GPU history covers every step."""
    live: dict[int, int] = {}
    total = best = step = 0
    best_live: Counter = Counter()
    for i, ev in enumerate(stream):
        if isinstance(ev, int):
            if ev >= 0:
                live[i] = ev
                total += ev
                if step >= first_step and total > best:
                    best, best_live = total, Counter(live.values())
            else:
                total -= live.pop(i + ev)
        elif ev[0] == "phase":
            step = step_of(ev[1]) or step
    return best_live


def more_on_gpu(gpu: list[tuple[int, str]], cpu: Counter) -> list[dict[str, Any]]:
    """Sizes the GPU held more of at its peak than the trace at its own, largest bytes first, with the GPU's origins."""
    counts = Counter(size for size, _ in gpu)
    out = []
    for size, n in counts.items():
        extra = n - cpu.get(size, 0)
        if extra > 0:
            where = Counter(o for s, o in gpu if s == size).most_common(3)
            out.append({"size": size, "extra": extra, "bytes": extra * size, "origins": where})
    return sorted(out, key=lambda r: -r["bytes"])


def record_on_gpu(rec: dict[str, Any], steps: int = 3) -> dict[str, Any]:
    """Run the record's job on this GPU with the allocation history on; the line `--read` reads."""
    import torch

    job = align_allocator(record_job(rec), "cuda")
    torch.cuda.memory._record_memory_history(max_entries=MAX_ENTRIES, stacks="python")
    try:
        measured = measure(job, device="cuda", steps=steps)
        snap = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    events = snap["device_traces"][torch.cuda.current_device()]
    peak, live = live_at_peak(events)
    return {"case": rec["case"], "record_id": rec["id"], "status": measured.get("status"),
            "peak_allocated_bytes": measured.get("peak_allocated_bytes"), "history_peak_bytes": peak,
            "events": len(events), "truncated": len(events) >= MAX_ENTRIES, "live": live}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hpcmem.lab.peak_blocks", description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="dpo-qwen05-lora,grpo-qwen05-lora,rloo-qwen05-lora,sft-qwen05-lora")
    ap.add_argument("--records", type=Path, default=RECORDS)
    ap.add_argument("--events", type=Path, default=EVENTS, help="folder of stored streams (for --read)")
    ap.add_argument("--out", type=Path, default=None, help="append the GPU lines here too")
    ap.add_argument("--read", type=Path, default=None, metavar="JSONL", help="compare stored GPU lines with the trace")
    args = ap.parse_args(argv)
    return refuse_unreadable(lambda: _run(args), ap.prog, "--read: the JSON lines this tool wrote with --out; "
                             "--events: the stored streams' folder")


def _run(args: argparse.Namespace) -> int:
    if args.read is not None:
        for line in args.read.read_text().splitlines():
            x = json.loads(line)
            stream = load(args.events / f"{x['case']}.json.gz")["events"]
            rows = more_on_gpu([tuple(b) for b in x["live"]], trace_live_at_peak(stream))
            print(f"{x['case']}: GPU history peak {x['history_peak_bytes'] / MIB:.1f} MiB")
            for r in rows[:8]:
                print(f"  +{r['extra']} × {r['size'] / MIB:.3f} MiB = {r['bytes'] / MIB:.2f} MiB  {r['origins']}")
        return 0
    wanted = set(args.only.split(","))
    records = [json.loads(x) for x in args.records.read_text().splitlines() if x.strip()]
    for rec in scored(records):
        if rec["case"] in wanted:
            line = json.dumps(record_on_gpu(rec))
            print(line, flush=True)
            if args.out is not None:
                with args.out.open("a") as f:
                    f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

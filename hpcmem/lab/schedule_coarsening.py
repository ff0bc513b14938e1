"""How much of the allocator model's reserved peak under expandable segments a coarser allocation schedule keeps:
stored device streams (hpcmem.trace.events) reshaped the way a torch-free schedule built from the estimate would see
them, each replayed through hpcmem.estimate.caching_allocator (expandable_segments=True).

    python -m hpcmem.lab.schedule_coarsening STREAM.json.gz ... [--points validate.json]

Variants (blocks > 1 MiB are the large pool; blocks ≤ 1 MiB live in the small pool, a separate range of 2 MiB pages,
c10/cuda/CUDACachingAllocator.cpp `get_pool`, so they never share pages with the large ones):
- `large`: only the large pool (every malloc > 1 MiB and its free) — the large pool's pages exactly;
- `no_1_4`: also without the 1–4 MiB blocks (the large blocks ≥ 4 MiB in their exact order);
- `start` / `end` / `blocks`: the large pool, with the transients of each decoder-layer phase (a malloc > 1 MiB freed
  in the same phase occurrence, hpcmem.trace.phases' "… / layer k") replaced by their phase's transient peak — one
  block at the phase's start, one at its end, or as many blocks of the phase's largest transient as the peak needs
  (the estimate knows a layer's peak and its largest block, hpcmem.estimate.allocator `largest_layer_block`); every
  allocation that outlives its phase (saved tensors, gradients, weights, states, the head's blocks) stays as traced;
- `merged`: `blocks`, with every run of consecutive mallocs allocated in one phase occurrence and freed in one merged
  into one block (freed at the run's first free);
- `merged_persistent`: `blocks`, with only the weights' and step one's optimizer states' runs merged.
Printed per stream and variant: the reserved and the slack (reserved − allocated, steps ≥ 2) against the unchanged
stream's, in % of its reserved, the mallocs replayed and the replay's wall time. With `--points` (the JSON of
`hpcmem validate trace --reserved --rescore --json`) the estimate's expandable error for the same case is
joined and the variants' |Δslack| are summarised beside it, all and held out (hpcmem.lab.reserved_fit `held_out`).
A measurement to report, not a test. Stdlib only.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from hpcmem.errors import refuse_unreadable
from hpcmem.estimate.caching_allocator import K_SMALL_SIZE
from hpcmem.lab.reserved_fit import held_out
from hpcmem.trace.events import load
from hpcmem.trace.replay import replay
from hpcmem.validate.table import median, quantile

MIB = 1024**2
VARIANTS = ("large", "no_1_4", "start", "end", "blocks", "merged", "merged_persistent")
LAYER = "layer"                 # hpcmem.trace.phases names a decoder layer's phase "… / layer k"

Op = tuple  # ("m", id, nbytes) | ("f", id) | ("x", marker)


def parse(events: list[Any]) -> tuple[list[Op], dict[int, int], dict[int, int], dict[int, str]]:
    """The stream as ops with absolute ids, plus each malloc's phase occurrence (alloc and free) and their names."""
    ops: list[Op] = []
    born: dict[int, int] = {}
    died: dict[int, int] = {}
    names: dict[int, str] = {0: ""}
    occ = 0
    for i, ev in enumerate(events):
        if isinstance(ev, int):
            if ev >= 0:
                ops.append(("m", i, ev))
                born[i] = occ
            else:
                ops.append(("f", i + ev))
                died[i + ev] = occ
        else:
            if ev[0] == "phase":
                occ += 1
                names[occ] = ev[1] or ""
            ops.append(("x", ev))
    return ops, born, died, names


def encode(ops: list[Op]) -> list[Any]:
    """Back to the stream format: frees count back to their malloc."""
    out: list[Any] = []
    at: dict[int, int] = {}
    for op in ops:
        if op[0] == "m":
            at[op[1]] = len(out)
            out.append(op[2])
        elif op[0] == "f":
            out.append(at.pop(op[1]) - len(out))
        else:
            out.append(op[1])
    return out


def drop_below(events: list[Any], threshold: int) -> list[Any]:
    """Only the mallocs of at least `threshold` bytes (and their frees)."""
    return encode([op for op in parse(events)[0] if op[0] == "x" or _size(op, events) >= threshold])


def _size(op: Op, events: list[Any]) -> int:
    return op[2] if op[0] == "m" else events[op[1]]


def coarsen_layers(events: list[Any], how: str) -> list[Any]:
    """Each layer phase's large transients → its transient peak (`how`: "start", "end" or "blocks")."""
    ops, born, died, names = parse(events)
    size = {op[1]: op[2] for op in ops if op[0] == "m"}

    def transient(i: int) -> bool:
        return died.get(i) == born[i] and LAYER in names[born[i]] and size[i] > K_SMALL_SIZE

    peak: dict[int, int] = {}
    big: dict[int, int] = {}
    occ = live = 0
    for op in ops:
        if op[0] == "x" and op[1][0] == "phase":
            occ, live = occ + 1, 0
        elif op[0] == "m" and transient(op[1]):
            live += op[2]
            peak[occ] = max(peak.get(occ, 0), live)
            big[occ] = max(big.get(occ, 0), op[2])
        elif op[0] == "f" and transient(op[1]):
            live -= size[op[1]]
    out: list[Op] = []
    held: list[int] = []
    fresh = [-1]

    def take(o: int) -> None:
        if o not in peak:
            return
        n = 1 if how != "blocks" else -(-peak[o] // big[o])
        each = peak[o] if how != "blocks" else big[o]
        for _ in range(n):
            out.append(("m", fresh[0], each))
            held.append(fresh[0])
            fresh[0] -= 1

    occ = 0
    for op in ops:
        if op[0] == "x" and op[1][0] == "phase":
            if how == "end":
                take(occ)
            while held:
                out.append(("f", held.pop()))
            occ += 1
            out.append(op)
            if how != "end":
                take(occ)
        elif op[0] in "mf" and transient(op[1]):
            continue
        else:
            out.append(op)
    if how == "end":
        take(occ)
    while held:
        out.append(("f", held.pop()))
    return encode(out)


def merge_runs(events: list[Any], persistent_only: bool) -> list[Any]:
    """Consecutive mallocs of one lifetime class (allocated in one phase occurrence, freed in one) → one block, freed
    at its first member's free. `persistent_only`: only the weights' runs (setup) and step one's optimizer states'
    (allocated in an optimizer phase, freed after the last step or never)."""
    ops, born, died, names = parse(events)
    last_step = max((o for o, n in names.items() if n.startswith("step ")), default=0)

    def key(i: int) -> tuple[int, int | None] | None:
        if not persistent_only:
            return born[i], died.get(i)
        name, end = names[born[i]], died.get(i)
        kept = end is None or end > last_step
        return (born[i], -1) if kept and (name == "" or name.endswith("/ optimizer")) else None

    out: list[Op] = []
    lead: dict[int, int] = {}
    total: dict[int, int] = {}
    run: tuple[Any, int, int] | None = None        # (key, group id, index in out)
    gone: set[int] = set()
    for op in ops:
        if op[0] == "m":
            k = key(op[1])
            if k is not None and run is not None and run[0] == k:
                lead[op[1]] = run[1]
                total[run[1]] += op[2]
                out[run[2]] = ("m", run[1], total[run[1]])
                continue
            lead[op[1]] = op[1]
            total[op[1]] = op[2]
            out.append(op)
            run = (k, op[1], len(out) - 1) if k is not None else None
        elif op[0] == "f":
            run = None
            g = lead[op[1]]
            if g not in gone:
                gone.add(g)
                out.append(("f", g))
        else:
            if op[1][0] == "phase":
                run = None
            out.append(op)
    return encode(out)


def variant(events: list[Any], name: str) -> list[Any]:
    """The stream reshaped as `name` (module docstring)."""
    large = K_SMALL_SIZE + 1
    if name == "large":
        return drop_below(events, large)
    if name == "no_1_4":
        return drop_below(events, 4 * MIB)
    if name in ("start", "end", "blocks"):
        return drop_below(coarsen_layers(events, name), large)
    if name in ("merged", "merged_persistent"):
        return merge_runs(variant(events, "blocks"), name == "merged_persistent")
    raise ValueError(f"variant must be one of {', '.join(VARIANTS)}; got {name!r}")


def measure(events: list[Any]) -> dict[str, Any]:
    """Reserved and slack of the stream and of each variant (expandable segments), in MiB and % of the stream's."""
    full = replay(events, expandable=True)
    r0, a0 = full.steady_reserved_bytes, full.steady_allocated_bytes
    out: dict[str, Any] = {"reserved_mib": r0 / MIB, "slack_mib": (r0 - a0) / MIB}
    for name in VARIANTS:
        ev = variant(events, name)
        t = time.perf_counter()
        r = replay(ev, expandable=True)
        wall = time.perf_counter() - t
        rv, av = r.steady_reserved_bytes, r.steady_allocated_bytes
        out[name] = {"d_reserved_pct": 100 * (rv - r0) / r0, "d_slack_pct": 100 * ((rv - av) - (r0 - a0)) / r0,
                     "mallocs": sum(isinstance(e, int) and e >= 0 for e in ev), "replay_ms": 1e3 * wall}
    # `no_1_4` against the large pool alone: what the 1–4 MiB blocks of the large pool change by themselves
    out["no_1_4"]["vs_large_d_slack_pct"] = out["no_1_4"]["d_slack_pct"] - out["large"]["d_slack_pct"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hpcmem.lab.schedule_coarsening",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("streams", nargs="+", type=Path, help="gzip JSON device streams (validate --events, "
                    "estimator/allocator/*/*.json.gz)")
    ap.add_argument("--points", type=Path, default=None,
                    help="validate trace --reserved --rescore --json output, to join the estimate's error")
    args = ap.parse_args(argv)
    return refuse_unreadable(lambda: _run(args), ap.prog, "streams: gzip JSON from `validate --events`; --points: "
                             "the JSON of `validate trace --reserved --rescore --json`")


def _run(args: argparse.Namespace) -> int:
    rule: dict[tuple[str, str], float] = {}
    if args.points is not None:
        for p in json.loads(args.points.read_text())["points"]:
            if p["mode"] == "expandable":
                rule[(p["trainer"], p["case"])] = p["err_pct"]
    rows, seen = [], set()
    print("| stream | reserved MiB | slack MiB | " + " | ".join(f"{v} ΔR/Δslack %" for v in VARIANTS)
          + " | estimate err % |")
    for path in args.streams:
        data = load(path)
        case = data.get("case")
        case = case if isinstance(case, dict) else {"id": str(case or path.stem), "trainer": "sft"}
        key = (str(case.get("trainer", "sft")), str(case["id"]))
        if key in seen:
            continue
        seen.add(key)
        m = measure(data["events"])
        m["case"], m["rule_err_pct"], m["lora"] = key[1], rule.get(key), "lora" in path.name or "peft" in path.name
        rows.append(m)
        cells = " | ".join(f"{m[v]['d_reserved_pct']:+.2f}/{m[v]['d_slack_pct']:+.2f} ({m[v]['mallocs']}, "
                           f"{m[v]['replay_ms']:.1f} ms)" for v in VARIANTS)
        err = "" if m["rule_err_pct"] is None else f"{m['rule_err_pct']:+.2f}"
        print(f"| {path.name} | {m['reserved_mib']:.0f} | {m['slack_mib']:.0f} | {cells} | {err} |", flush=True)
    _summary(rows)
    return 0


def _summary(rows: list[dict[str, Any]]) -> None:
    def stats(errs: list[float]) -> str:
        a = sorted(abs(e) for e in errs)
        return f"n {len(a)} median {median(a):.2f} p95 {quantile(a, 0.95):.2f} max {a[-1]:.2f}" if a else "n 0"

    joined = [r for r in rows if r["rule_err_pct"] is not None]
    for label, part in (("all streams", rows), ("with the estimate's error", joined),
                        ("  held out", [r for r in joined if held_out(r["case"])]),
                        ("  full fine-tuning", [r for r in joined if not r["lora"]]),
                        ("  LoRA", [r for r in joined if r["lora"]])):
        print(label)
        for v in VARIANTS:
            print(f"  {v}: |Δslack| {stats([r[v]['d_slack_pct'] for r in part])}; replay ms median "
                  f"{median([r[v]['replay_ms'] for r in part]) if part else 0:.1f}")
        if part is not rows:
            print(f"  estimate: |err| {stats([r['rule_err_pct'] for r in part])}")


if __name__ == "__main__":
    sys.exit(main())

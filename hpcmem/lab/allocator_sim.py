"""How much the simulated CUDA caching allocator reserves beyond what is allocated, on traced TRL runs.

    python -m hpcmem.lab.allocator_sim [--per-file 4] [--ids a,b,...] [--cases estimator/cases/sft.yaml ...]

For `ci: true` cases of estimator/cases/sft.yaml and dpo.yaml (the first `--per-file` of each, or those named by
`--ids`), runs the `--kernels cuda` trace with the allocator model on in both modes (`run_trace(allocator="both")`,
hpcmem.estimate.caching_allocator) and prints:

    alloc      the trace's peak allocated (sum of 512 B-rounded requests: what the estimator models)
    t-alloc    the simulated torch `max_memory_allocated()` (unsplit blocks count whole)
    resv/exp   simulated `max_memory_reserved()`, default and expandable_segments:True
    %alloc     (reserved − alloc) / alloc, default / expandable
    %trans     (reserved − alloc) / transient bytes (alloc − param − grad − optimizer at the peak): the base of an
               early rule (10 % / 2 % of transient); `fit` was the later 5 % / 2.4 % of alloc (estimator/LOG.md),
               since replaced by hpcmem.estimate.allocator (python -m hpcmem.lab.reserved_fit)

A measurement to report, not a test; nothing is written unless asked:

    python -m hpcmem.lab.allocator_sim --ids qwen05-bf16-gc-2k --dump /tmp/events.json   # record the stream
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
        python -m hpcmem.lab.allocator_sim --replay /tmp/events.json                    # on a CUDA machine

`--dump` writes the trace's malloc/free stream ([nbytes, -1] for a birth, [-1, index of the birth] for a death);
`--replay` re-issues it as `torch.empty(nbytes, dtype=uint8, device="cuda")` / `del` on a real GPU and prints
`torch.cuda.max_memory_allocated/reserved()` next to the model's numbers for the same allocator setting — the check
of the model against the real allocator (not run yet: needs a GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from hpcmem.estimate.caching_allocator import AllocatorSet, CachingAllocator
from hpcmem.trace import run_trace
from hpcmem.trace.result import versions
from hpcmem.validate.cases import case_job
from hpcmem.validate.trace import load_cases

CASES_DIR = Path(__file__).resolve().parents[2] / "estimator" / "cases"
DEFAULT_FILES = ("sft.yaml", "dpo.yaml")
STEADY = ("param", "grad", "optimizer")
GIB = 1024**3
FORMER_FRACTIONS = {"default": 0.10, "expandable": 0.02}   # the rule before the fit: a fraction of transient bytes


def pick_cases(files: list[Path], per_file: int, ids: set[str] | None) -> list[dict]:
    """`ci: true` cases, the first `per_file` of each file (or exactly `ids`)."""
    out = []
    for f in files:
        cases = load_cases(f, ci_only=ids is None)
        out += [c for c in cases if str(c["id"]) in ids] if ids is not None else cases[:per_file]
    return out


def measure(case: dict) -> dict:
    """Trace one case with both allocator models; the row of the table."""
    start = time.perf_counter()
    r = run_trace(case_job(case), kernels="cuda", allocator="both")
    alloc = r.peak_allocated_bytes
    transient = alloc - sum(r.components.get(k, 0) for k in STEADY)
    row = {"id": str(case["id"]), "alloc": alloc, "transient": transient, "seconds": time.perf_counter() - start,
           "t_alloc": r.allocator["default"]["peak_allocated_bytes"]}
    for mode, key in (("default", "resv"), ("expandable", "exp")):
        st = r.allocator[mode]
        # the replay adds cuBLAS's workspaces (hpcmem.trace.replay) to the traced tensors
        assert st["peak_requested_bytes"] == alloc + st["workspace_bytes"], (case["id"], mode)
        row[key] = st["peak_reserved_bytes"]
        row[f"{key}_segments"] = st["peak_segments"]
    return row


class Recorder:
    """A `run_trace(allocator=...)` listener that keeps the event stream (and a model fed the same stream)."""

    def __init__(self) -> None:
        self.events: list[tuple[int, int]] = []
        self.sims = AllocatorSet()

    def malloc(self, nbytes: int) -> tuple[int, tuple[int, ...]]:
        self.events.append((nbytes, -1))
        return len(self.events) - 1, self.sims.malloc(nbytes)

    def free(self, handle: tuple[int, tuple[int, ...]]) -> None:
        self.events.append((-1, handle[0]))
        self.sims.free(handle[1])

    def stats(self) -> dict:
        return self.sims.stats()


def dump(case: dict, path: Path) -> None:
    rec = Recorder()
    r = run_trace(case_job(case), kernels="cuda", allocator=rec)
    path.write_text(json.dumps({"case": case["id"], "peak_allocated_bytes": r.peak_allocated_bytes,
                                "model": rec.stats(), "events": rec.events}))
    print(f"{len(rec.events)} events of {case['id']} → {path}")


def replay(path: Path) -> None:
    """Re-issue a dumped stream on the current CUDA device; compare with the model for this process's setting."""
    import torch

    data = json.loads(path.read_text())
    expandable = "expandable_segments:true" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "").replace(" ", "").lower()
    sim = CachingAllocator(expandable_segments=expandable)
    torch.cuda.init()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_reserved()
    live: dict[int, object] = {}
    handles: dict[int, int] = {}
    for i, (nbytes, born) in enumerate(data["events"]):
        if nbytes >= 0:
            live[i] = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
            handles[i] = sim.malloc(nbytes)
        else:
            del live[born]
            sim.free(handles.pop(born))
    torch.cuda.synchronize()
    real = torch.cuda.memory_stats()
    print(f"{data['case']}  expandable_segments={expandable}  (reserved before the replay: {base} B)")
    for name, key, mine in (("max allocated", "allocated_bytes.all.peak", sim.stats.peak_allocated_bytes),
                            ("max reserved", "reserved_bytes.all.peak", sim.stats.peak_reserved_bytes),
                            ("segments (peak)", "segment.all.peak", sim.stats.peak_segments)):
        print(f"  {name:<16} real {real[key]:>16,}  model {mine:>16,}")


def pct(num: int, den: int) -> str:
    return f"{100.0 * num / den:6.1f}" if den else "   n/a"


def table(rows: list[dict]) -> str:
    head = (f"{'case':<28}{'alloc':>8}{'t-alloc':>9}{'resv':>8}{'exp':>8}{'trans':>8}"
            f"{'%alloc d/e':>16}{'%trans d/e':>16}{'segs':>6}{'s':>6}")
    lines = [head, "-" * len(head)]
    for r in rows:
        d, e = r["resv"] - r["alloc"], r["exp"] - r["alloc"]
        lines.append(f"{r['id']:<28}{r['alloc'] / GIB:>8.2f}{r['t_alloc'] / GIB:>9.2f}{r['resv'] / GIB:>8.2f}"
                     f"{r['exp'] / GIB:>8.2f}{r['transient'] / GIB:>8.2f}"
                     f"{pct(d, r['alloc'])} /{pct(e, r['alloc'])}{pct(d, r['transient'])} /{pct(e, r['transient'])}"
                     f"{r['resv_segments']:>6}{r['seconds']:>6.0f}")
    if rows:
        med = [statistics.median(100.0 * (r[k] - r["alloc"]) / r[den] for r in rows if r[den])
               for k, den in (("resv", "alloc"), ("exp", "alloc"), ("resv", "transient"), ("exp", "transient"))]
        lines.append(f"{'median':<69}{med[0]:6.1f} /{med[1]:6.1f}{med[2]:6.1f} /{med[3]:6.1f}")
    lines.append("GiB; %: (reserved − alloc) relative to alloc and to the transient bytes")
    return "\n".join(lines)


def fit(rows: list[dict]) -> dict:
    """The former slack fraction (until hpcmem.estimate.allocator): median (reserved − alloc) / alloc on the even-indexed rows, and
    the error of the reserved peak on the odd-indexed (held-out) rows, next to the former 10 % / 2 % of transient."""
    train, test = rows[0::2], rows[1::2]
    out: dict = {"n_train": len(train), "n_test": len(test)}
    for key, mode in (("resv", "default"), ("exp", "expandable")):
        former = FORMER_FRACTIONS[mode]
        f = statistics.median((r[key] - r["alloc"]) / r["alloc"] for r in train)
        entry = {"fraction_of_allocated": round(f, 4)}
        for name, pred in (("fitted", lambda r: r["alloc"] * (1 + f)),
                           ("former", lambda r: r["alloc"] + former * r["transient"])):
            errs = sorted(abs(100.0 * (pred(r) - r[key]) / r[key]) for r in test)
            entry[name] = {"median_abs_err_pct": round(statistics.median(errs), 2),
                           "p90_abs_err_pct": round(errs[max(0, int(0.9 * len(errs)) - 1)], 2),
                           "max_abs_err_pct": round(errs[-1], 2),
                           "under": sum(pred(r) < r[key] for r in test)}
        out[mode] = entry
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="*", type=Path, default=[CASES_DIR / f for f in DEFAULT_FILES])
    parser.add_argument("--per-file", type=int, default=4)
    parser.add_argument("--ids", default=None, help="comma-separated case ids (any ci flag)")
    parser.add_argument("--dump", type=Path, default=None, help="write the event stream of the first case here")
    parser.add_argument("--replay", type=Path, default=None, help="replay a dumped stream on CUDA")
    parser.add_argument("--save", type=Path, default=None, help="write the rows and the fit as JSON (with versions)")
    parser.add_argument("--refit", type=Path, default=None, help="print the fit of rows saved earlier (no tracing)")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.replay is not None:
        replay(args.replay)
        return
    if args.refit is not None:
        print(json.dumps(fit(json.loads(args.refit.read_text())["rows"]), indent=1))
        return
    ids = set(args.ids.split(",")) if args.ids else None
    if args.dump is not None:
        dump(pick_cases(args.cases, args.per_file, ids)[0], args.dump)
        return
    rows = []
    for case in pick_cases(args.cases, args.per_file, ids):
        row = measure(case)
        rows.append(row)
        print(f"{row['id']}: {row['seconds']:.0f} s", flush=True)
    print(table(rows))
    fitted = fit(rows) if len(rows) > 1 else None
    print(json.dumps(fitted, indent=1))
    if args.save is not None:
        args.save.write_text(json.dumps({"versions": versions(), "cases": [str(c) for c in args.cases],
                                         "fit": fitted, "rows": rows}, indent=1) + "\n")
        print(f"rows → {args.save}")


if __name__ == "__main__":
    main()

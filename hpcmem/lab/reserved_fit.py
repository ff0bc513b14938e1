"""Fit the reserved-slack coefficients of hpcmem.estimate.allocator to the caching-allocator model over the trace
matrix, and report how they do on cases left out of the fit.

    python -m hpcmem.lab.reserved_fit [--save estimator/reserved-fit.json] [--thirds] [--with-random]

Rows: every stored trace record that carries the allocator model's reserved peak (`hpcmem validate trace --reserved`),
once per allocator mode. Target: the model's slack, reserved − (traced tensors + the estimate's cuBLAS workspaces and
block tails + the unfitted `accumulated_stacks` term, the row's "fixed"). Terms: `slack_terms` of the estimate for the
same job. Fit: least absolute deviations of the slack relative to the reserved peak, non-negative coefficients, on the
training split — cases whose sha1(id) % 3 != 0 — then scored on the held-out third. Least absolute deviations, not least
squares: the scores are the median and p95 of |error|, and a squared loss lets the few cases whose stranded blocks no
term describes (path-specific fragmentation) pull every coefficient. Solved by iteratively reweighted least squares
(weights 1 / max(|residual|, 1e-5), each step a non-negative least squares on the k × k normal equations, every subset
of terms solved exactly); stops when no coefficient moves by 1e-9 (at most 500 steps). Stdlib only.

`--thirds` also fits and scores with each third held out in turn (sha1(id) % 3 == 0, 1, 2): one 63-case third's p95
moves by a few tenths with its fourth-largest error, so a change to the terms is judged on all three. Each mode's rule
is scored alone; `held_out_shipped` / `default_shipped` score what the estimate ships for the default allocator, the
larger of the default and the expandable rule (hpcmem.estimate.allocator `allocator_slack`).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import itertools
import json
import sys
from pathlib import Path
from typing import Any

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.estimate.allocator import TERMS, accumulated_stacks, slack_terms
from hpcmem.estimate.lora import lora_layout
from hpcmem.estimate.workspaces import tensor_bytes
from hpcmem.job.shape import micro_batch, precision
from hpcmem.validate.cases import case_job
from hpcmem.validate.random_jobs import RandomJob
from hpcmem.validate.random_model import job_spec
from hpcmem.validate.random_trace import as_traced
from hpcmem.validate.table import median, quantile

ROOT = Path(__file__).resolve().parents[2]
FIT = ROOT / "estimator" / "reserved-fit.json"
HOLDOUT_EVERY = 3
MODES = ("default", "expandable")


def held_out(case_id: str, third: int = 0) -> bool:
    return int(hashlib.sha1(case_id.encode()).hexdigest(), 16) % HOLDOUT_EVERY == third


def rows(traces: Path | None = None) -> list[dict[str, Any]]:
    """One row per (case, mode): the terms, the model's slack, the estimate's allocated and the model's reserved.
    Image-text matrices (vlm-*) are left out: the terms describe a decoder's blocks, not a vision tower's, and an
    estimate with images carries its own reserved warning."""
    out = []
    for path in sorted((traces or ROOT / "estimator" / "traces").glob("*.jsonl")):
        if path.stem.endswith("-ci") or path.stem.endswith(".partial") or path.stem.startswith("vlm"):
            continue
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            for mode in MODES:
                reserved = (rec.get("reserved") or {}).get(mode)
                if reserved is None:
                    continue
                job = dataclasses.replace(case_job(rec["case"]), expandable_segments=mode == "expandable")
                est = estimate(job)
                ws = est.peak_phase.bytes - tensor_bytes(est.peak_phase)      # workspaces + block tails
                terms = slack_terms(job, micro_batch(job), precision(job), lora_layout(job), list(est.phases))
                fixed = accumulated_stacks(job, precision(job), lora_layout(job), mode == "expandable")
                out.append({"case": str(rec["case"]["id"]), "file": path.stem, "mode": mode, "terms": terms,
                            "fixed": fixed, "slack": reserved - rec["traced"] - ws - fixed, "reserved": reserved,
                            "allocated": est.peak_allocated_bytes})
    return out


def random_rows(path: Path | None = None) -> list[dict[str, Any]]:
    """One row per random job the trace ran with the allocator model (default mode only: `hpcmem validate random
    --oracle trace` replays that one), single GPU, as `rows` makes them; the estimate over the instants the trace
    runs (hpcmem.validate.random_trace `as_traced`)."""
    out = []
    path = path or ROOT / "estimator" / "random" / "trace.jsonl"
    for line in path.read_text().splitlines() if path.is_file() else []:
        rec = json.loads(line)
        trace = rec.get("trace") or {}
        reserved = (trace.get("reserved") or {}).get("default")
        if not reserved:
            continue
        try:
            job = job_spec(RandomJob.from_dict(rec["job"]))
            if job.parallel.world_size > 1:
                continue
            est, _ = as_traced(job)
        except SpecError:
            continue                    # refused or declined today: nothing to fit
        ws = est.peak_phase.bytes - tensor_bytes(est.peak_phase)
        terms = slack_terms(job, micro_batch(job), precision(job), lora_layout(job), list(est.phases))
        fixed = accumulated_stacks(job, precision(job), lora_layout(job), False)
        out.append({"case": str(rec["id"]), "file": "random", "mode": "default", "terms": terms, "fixed": fixed,
                    "slack": reserved - trace["peak_allocated_bytes"] - ws - fixed, "reserved": reserved,
                    "allocated": est.peak_allocated_bytes})
    return out


def _solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; None when singular."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for c in range(n):
        p = max(range(c, n), key=lambda r: abs(m[r][c]))
        if abs(m[p][c]) < 1e-12:
            return None
        m[c], m[p] = m[p], m[c]
        for r in range(n):
            if r != c:
                f = m[r][c] / m[c][c]
                m[r] = [x - f * y for x, y in zip(m[r], m[c], strict=True)]
    return [m[i][n] / m[i][i] for i in range(n)]


def nnls(a: list[list[float]], b: list[float], yy: float) -> list[float]:
    """min c'Ac − 2b'c + yy over c ≥ 0 (the normal equations A = X'WX, b = X'Wy, yy = y'Wy of a weighted least
    squares), exactly, by solving every subset of columns (fine for a handful of terms)."""
    k = len(b)
    best, best_err = [0.0] * k, yy
    for size in range(1, k + 1):
        for cols in itertools.combinations(range(k), size):
            sol = _solve([[a[i][j] for j in cols] for i in cols], [b[i] for i in cols])
            if sol is None or min(sol) < 0:
                continue
            c = [0.0] * k
            for i, v in zip(cols, sol, strict=True):
                c[i] = v
            err = (sum(c[i] * a[i][j] * c[j] for i in range(k) for j in range(k))
                   - 2 * sum(bi * ci for bi, ci in zip(b, c, strict=True)) + yy)
            if err < best_err:
                best, best_err = c, err
    return best


def weighted_nnls(x: list[list[float]], y: list[float], w: list[float]) -> list[float]:
    """min Σ w·(Xc − y)² over c ≥ 0: the k × k normal equations, then `nnls`."""
    k = len(x[0])
    a = [[sum(wi * r[i] * r[j] for r, wi in zip(x, w, strict=True)) for j in range(k)] for i in range(k)]
    b = [sum(wi * r[i] * v for r, v, wi in zip(x, y, w, strict=True)) for i in range(k)]
    return nnls(a, b, sum(wi * v * v for v, wi in zip(y, w, strict=True)))


def lad(x: list[list[float]], y: list[float], *, floor: float = 1e-5, steps: int = 500) -> list[float]:
    """min Σ|Xc − y| over c ≥ 0 by iteratively reweighted least squares (module docstring)."""
    c = weighted_nnls(x, y, [1.0] * len(y))
    for _ in range(steps):
        residuals = [sum(ci * ri for ci, ri in zip(c, r, strict=True)) - v for r, v in zip(x, y, strict=True)]
        w = [1.0 / max(abs(e), floor) for e in residuals]
        new = weighted_nnls(x, y, w)
        if max(abs(p - q) for p, q in zip(new, c, strict=True)) < 1e-9:
            return new
        c = new
    return c


def fit(data: list[dict[str, Any]], third: int = 0) -> dict[str, Any]:
    """Coefficients per mode from the training split; errors of the reserved peak on both splits."""
    out: dict[str, Any] = {"terms": list(TERMS), "split": f"held out when sha1(case id) % {HOLDOUT_EVERY} == {third}",
                           "loss": "least absolute deviations of slack / reserved, coefficients ≥ 0"}
    for mode in MODES:
        rows_m = [r for r in data if r["mode"] == mode]
        train = [r for r in rows_m if not held_out(r["case"], third)]
        x = [[r["terms"][t] / r["reserved"] for t in TERMS] for r in train]
        y = [r["slack"] / r["reserved"] for r in train]
        coef = [round(c, 4) for c in lad(x, y)]
        entry: dict[str, Any] = {"coefficients": dict(zip(TERMS, coef, strict=True))}
        held = [r for r in rows_m if held_out(r["case"], third)]
        parts = [("train", train), ("held_out", held)]
        if any(r.get("file") == "random" for r in data):          # `--with-random`: held out per source too
            parts += [("held_out_matrix", [r for r in held if r["file"] != "random"]),
                      ("held_out_random", [r for r in held if r["file"] == "random"])]
        for name, part in parts:
            entry[name] = score(part, entry["coefficients"])
        out[mode] = entry
    # What the estimate ships for the default allocator is the larger of the two rules (`allocator_slack`): score
    # that too, so a change to the expandable rule that moves default-mode estimates is seen here.
    expandable_terms = {r["case"]: r["terms"] for r in data if r["mode"] == "expandable"}
    held = [r for r in data if r["mode"] == "default" and held_out(r["case"], third)]
    out["default"]["held_out_shipped"] = score(held, out["default"]["coefficients"],
                                               (expandable_terms, out["expandable"]["coefficients"]))
    return out


def thirds(data: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Held-out reserved median / p95 per mode with each third held out in turn (the saved fit is third 0)."""
    out: dict[str, dict[str, Any]] = {}
    for third in range(HOLDOUT_EVERY):
        result = fit(data, third)
        keys = ("n", "reserved_median_abs_err_pct", "reserved_p95_abs_err_pct")
        out[str(third)] = {mode: {k: result[mode]["held_out"][k] for k in keys} for mode in MODES}
        out[str(third)]["default_shipped"] = {k: result["default"]["held_out_shipped"][k] for k in keys}
    return out


def score(part: list[dict[str, Any]], coef: dict[str, float],
          floor: tuple[dict[str, dict[str, int]], dict[str, float]] | None = None) -> dict[str, Any]:
    """Reserved error (estimate's allocated + predicted slack vs the model) and slack-only error, in %. With `floor`
    (each case's expandable-mode terms and the expandable coefficients) the slack is the larger of the two rules, as
    the estimate ships it for the default allocator."""
    if not part:
        return {"n": 0}
    end, only = [], []
    for r in part:
        slack = max(0.0, sum(coef[t] * r["terms"][t] for t in coef))
        if floor is not None and r["case"] in floor[0]:
            slack = max(slack, sum(floor[1][t] * floor[0][r["case"]][t] for t in floor[1]))
        end.append(100.0 * (r["allocated"] + slack + r.get("fixed", 0) - r["reserved"]) / r["reserved"])
        only.append(100.0 * (slack - r["slack"]) / r["reserved"])
    return {"n": len(part), **_stats("reserved", end), **_stats("slack_only", only)}


def _stats(prefix: str, errs: list[float]) -> dict[str, float]:
    a = [abs(e) for e in errs]
    return {f"{prefix}_median_abs_err_pct": round(median(a), 3), f"{prefix}_p95_abs_err_pct": round(quantile(a, 0.95), 3),
            f"{prefix}_max_abs_err_pct": round(max(a), 3), f"{prefix}_under": sum(e < 0 for e in errs)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hpcmem.lab.reserved_fit", description=__doc__.splitlines()[0])
    ap.add_argument("--save", type=Path, default=None, help="write the rows and the fit here (JSON)")
    ap.add_argument("--thirds", action="store_true", help="also fit and score with each third held out in turn")
    ap.add_argument("--with-random", action="store_true",
                    help="fit on the random jobs the trace ran too (estimator/random/trace.jsonl, default mode); the "
                    "held-out score is then split into matrix and random rows")
    args = ap.parse_args(argv)
    data = rows() + (random_rows() if args.with_random else [])
    if not data:
        print("no trace record carries the allocator model's reserved peak; run "
              "`hpcmem validate trace --reserved` first", file=sys.stderr)
        return 2
    result = fit(data)
    if args.thirds:
        result["thirds"] = thirds(data)
    print(json.dumps(result, indent=1))
    if args.save is not None:
        try:
            args.save.write_text(json.dumps({"fit": result, "rows": data}, indent=1, sort_keys=True) + "\n")
        except OSError as exc:
            print(f"--save {args.save}: cannot write it ({exc.strerror or exc})", file=sys.stderr)
            return 2
        print(f"rows and fit → {args.save}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

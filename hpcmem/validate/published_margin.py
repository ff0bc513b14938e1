"""The safe-bound margin of multi-GPU jobs, fitted on published multi-GPU rows and scored on sources it was not fitted
on (leave-one-source-out).

Evidence: every scored published row run on more than one GPU whose peak bounds what the job needs (reserved or the
whole device; an allocated peak leaves out the allocator's reserve) and whose estimate is TRL 1.16's step or
adjusted to the row's loop (hpcmem.validate.published_loop) — the error left is the estimate's own, which is what a
margin widens. Each row needs max(0, measured / upper − 1), upper = the (adjusted) estimate of the row's peak + half
the estimate's reserved spread (hpcmem.estimate.verdict `upper`); a reserved row's need stands in for the device
peak's (the device peak adds the context and NCCL to both sides).

The margin is the split-conformal one the GPU calibrations use (hpcmem.validate.calibration `conformal_margin`): the
k-th smallest need, k = min(n, ⌈TARGET_COVERAGE · (n + 1)⌉), with in-sample coverage k / (n + 1).

Held-out score: for each source, the margin is fitted on the other sources' rows and the held-out source's rows are
covered when measured ≤ upper · (1 + margin). The held-out coverage reported is covered / rows over all sources: how
often a margin chosen without a source covered that source's rows. Rows of one source share a loop, GPUs and
authors, so holding out a source, not a row, is the test that counts.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from pathlib import Path
from typing import Any

from hpcmem.estimate.verdict import upper
from hpcmem.validate.calibration import TARGET_COVERAGE, conformal_margin
from hpcmem.validate.published_score import Scored

EVIDENCE_PEAKS = ("reserved", "device")
SCHEMA = 1


def evidence(points: list[Scored], multi: bool = True) -> list[Scored]:
    """The rows a multi-GPU (or, `multi` False, a single-GPU) margin is fitted on (module docstring); an outcome row
    (no measured peak) is not."""
    return [p for p in points if (p.gpus > 1) == multi and p.peak in EVIDENCE_PEAKS and p.adjusted_gib is not None
            and p.measured_gib is not None]


def bound_base(p: Scored) -> float:
    """What the margin widens for a row: the (adjusted) estimate + half the reserved spread, GiB."""
    return upper(p.adjusted_gib, p.spread_gib)


def need(p: Scored) -> float:
    return max(0.0, p.measured_gib / bound_base(p) - 1.0)


def covered(p: Scored, margin: float) -> bool:
    return p.measured_gib <= bound_base(p) * (1.0 + margin)


def leave_one_source_out(rows: list[Scored]) -> list[dict[str, Any]]:
    """Per source: the margin fitted without it and how many of its rows that margin covers."""
    out = []
    for source in sorted({p.source for p in rows}):
        train = [need(p) for p in rows if p.source != source]
        held = [p for p in rows if p.source == source]
        m = conformal_margin(train)
        if m is None:          # the only source: nothing is left to fit a margin on, so nothing is held out
            continue
        margin = m["margin"]
        out.append({"source": source, "n": len(held), "margin": margin, "fitted_on": len(train),
                    "covered": sum(covered(p, margin) for p in held),
                    "not_covered": [p.id for p in held if not covered(p, margin)]})
    return out


def fit(points: list[Scored], multi: bool = True) -> dict[str, Any] | None:
    """The multi-GPU (or single-GPU) margin with its provenance and held-out score; None without evidence. With one
    source, leave-one-source-out has nothing to fit on: its held-out count is 0 of 0 and the margin is in-sample."""
    rows = evidence(points, multi)
    what = "multi-GPU" if multi else "single-GPU"
    m = conformal_margin([need(p) for p in rows])
    if m is None:
        return None
    loso = leave_one_source_out(rows)
    held_n, held_covered = sum(s["n"] for s in loso), sum(s["covered"] for s in loso)
    sources = sorted({p.source for p in rows})
    return {
        "schema": SCHEMA, "kind": f"{what.lower()} margin", "peak": "device",
        "margin": m["margin"], "n": m["n"], "k": m["k"], "coverage": m["coverage"],
        "target_coverage": TARGET_COVERAGE,
        "held_out": {"method": "leave one source out", "covered": held_covered, "n": held_n,
                     "per_source": loso},
        "evidence": {"rows": [p.id for p in rows], "sources": sources,
                     "rows_sha1": hashlib.sha1("".join(sorted(p.id for p in rows)).encode()).hexdigest(),
                     "largest_need": max(rows, key=need).id,
                     "what": f"published {what} rows (estimator/published/), reserved or device peak, estimate "
                             "loop-adjusted (hpcmem/validate/published_loop.py)"},
        "fitted_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }


def save(margin: dict[str, Any], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(margin, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return path


def render(margin: dict[str, Any] | None, what: str = "multi-GPU") -> str:
    if margin is None:
        return f"{what} margin: no {what} evidence"
    h = margin["held_out"]
    lines = [f"{what} margin {100 * margin['margin']:.1f} % from {margin['n']} published {what} rows "
             f"({len(margin['evidence']['sources'])} source(s); in-sample conformal coverage "
             f"{100 * margin['coverage']:.1f} %, largest need {margin['evidence']['largest_need']}); "
             + (f"held out, one source at a time: {h['covered']}/{h['n']} rows covered" if h["n"] else
                "nothing held out (one source: in-sample only)")]
    for s in h["per_source"]:
        miss = f"; not covered: {', '.join(s['not_covered'])}" if s["not_covered"] else ""
        lines.append(f"  without {s['source']:<22} margin {100 * s['margin']:5.1f} % (n={s['fitted_on']}): "
                     f"covers {s['covered']}/{s['n']}{miss}")
    return "\n".join(lines)

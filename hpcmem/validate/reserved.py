"""`hpcmem validate trace --reserved`: the estimate's reserved peak against the caching-allocator model
replaying each traced step (hpcmem.trace.replay: the trace's device stream + cuBLAS/cuBLASLt workspaces), per cell
and allocator mode.

Each stored trace record holds the model's reserved peak for both modes (`reserved: {default, expandable}`); the case
is estimated once per mode (its spec with expandable_segments off / on). err % = 100·(estimate − model)/model.
"slack only" scores the estimate's reserved − allocated on top of the traced allocated peak (+ what no tensor
holds: the workspaces and block tails, hpcmem.estimate.workspaces `tensor_bytes`):
the error the reserved rule adds by itself, without the allocated estimate's own error. "beyond ± spread" scores
what lies outside the estimate ± half the block it says it cannot place (`reserved_spread_bytes`: the LM head's
[V, H] gradient, Reward's embedding gradient, or under LoRA a decoder layer's largest block, that the second step may
map again; hpcmem.estimate.allocator.placement_spread): 0 inside.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from hpcmem.datapath import estimator_dir
from hpcmem.errors import HpcmemError
from hpcmem.estimate import estimate
from hpcmem.estimate.workspaces import tensor_bytes
from hpcmem.validate.cases import case_job
from hpcmem.validate.table import median, quantile

MODES = ("default", "expandable")


def reserved_points(results: list[Any]) -> list[dict[str, Any]]:
    """One row per (case, mode) that has the model's reserved peak."""
    rows = []
    for r in results:
        model = r.record.get("reserved")
        if not model:
            continue
        job = case_job(r.record["case"])
        for mode in MODES:
            if mode not in model:
                continue
            est = estimate(dataclasses.replace(job, expandable_segments=mode == "expandable"))
            ws = est.peak_phase.bytes - tensor_bytes(est.peak_phase)      # workspaces + block tails
            slack = est.peak_reserved_bytes - est.peak_allocated_bytes
            beyond = max(0.0, abs(est.peak_reserved_bytes - model[mode]) - est.reserved_spread_bytes / 2)
            images = job.train.has_images
            rows.append({"case": r.case_id, "trainer": r.trainer, "technique": r.technique, "mode": mode,
                         "images": images,
                         "model": model[mode], "estimate": est.peak_reserved_bytes,
                         "err_pct": 100.0 * (est.peak_reserved_bytes - model[mode]) / model[mode],
                         "spread": est.reserved_spread_bytes, "beyond_spread_pct": 100.0 * beyond / model[mode],
                         "slack_err_pct": 100.0 * (r.traced + ws + slack - model[mode]) / model[mode]})
    return rows


def _stats(errs: list[float]) -> dict[str, Any]:
    a = [abs(e) for e in errs]
    return {"n": len(errs), "median_abs_err_pct": median(a), "p95_abs_err_pct": quantile(a, 0.95),
            "max_abs_err_pct": max(a), "bias_pct": sum(errs) / len(errs), "under": sum(e < 0 for e in errs)}


def cell_rows(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per trainer × technique × allocator mode over the text-only cases, their "all" rows, and the cases with images
    apart ("images"): an image job's reserved peak is not held to the text jobs' figures (its estimate warns so), so
    its cases do not enter the text rows."""
    text = [p for p in points if not p.get("images")]
    cells: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for p in text:
        cells.setdefault((p["trainer"], p["technique"], p["mode"]), []).append(p)
        cells.setdefault(("all", "all", p["mode"]), []).append(p)
    out = []
    for (trainer, technique, mode), ps in sorted(cells.items(), key=lambda kv: (kv[0][0] == "all", kv[0])):
        out.append({"trainer": trainer, "technique": technique, "mode": mode, **_stats([p["err_pct"] for p in ps]),
                    **_extra(ps)})
    if text:
        out.append({"trainer": "all", "technique": "all", "mode": "both", **_stats([p["err_pct"] for p in text]),
                    **_extra(text)})
    for mode in MODES:
        ps = [p for p in points if p.get("images") and p["mode"] == mode]
        if ps:
            out.append({"trainer": "images", "technique": "all", "mode": mode,
                        **_stats([p["err_pct"] for p in ps]), **_extra(ps)})
    return out


def _extra(ps: list[dict[str, Any]]) -> dict[str, Any]:
    return {"slack_only_median_abs_err_pct": median([abs(p["slack_err_pct"]) for p in ps]),
            "with_spread": sum(p["spread"] > 0 for p in ps),
            "p95_beyond_spread_pct": quantile([p["beyond_spread_pct"] for p in ps], 0.95)}


def render(rows: list[dict[str, Any]]) -> str:
    lines = ["| trainer | technique | allocator | n | median abs err % | p95 | max | bias % | under | slack only: median "
             "| with ± spread | p95 beyond ± spread % |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['trainer']} | {r['technique']} | {r['mode']} | {r['n']} | {r['median_abs_err_pct']:.2f} | "
                     f"{r['p95_abs_err_pct']:.2f} | {r['max_abs_err_pct']:.2f} | {r['bias_pct']:+.2f} | "
                     f"{r['under']} | {r['slack_only_median_abs_err_pct']:.2f} | {r['with_spread']} | "
                     f"{r['p95_beyond_spread_pct']:.2f} |")
    return "\n".join(lines)


def report_reserved(results: list[Any], *, as_json: bool = False, write: bool = False) -> list[dict[str, Any]]:
    """Print the reserved table; with `write`, also estimator/ACCURACY-reserved.md."""
    import click

    points = reserved_points(results)
    if not points:
        raise HpcmemError("no stored trace carries the allocator model's reserved peak; run "
                          "`hpcmem validate trace --reserved` without --rescore first")
    rows = cell_rows(points)
    worst = sorted([p for p in points if not p.get("images")] or points, key=lambda p: abs(p["err_pct"]),
                   reverse=True)[:5]
    if write:
        Path(estimator_dir() / "ACCURACY-reserved.md").write_text(markdown(rows, worst))
    if as_json:
        click.echo(json.dumps({"cells": rows, "points": points}, indent=1))
    else:
        click.echo(render(rows))
        for p in worst:
            click.echo(f"largest: {p['case']} ({p['mode']}) {p['err_pct']:+.2f} %")
    return rows


def markdown(rows: list[dict[str, Any]], worst: list[dict[str, Any]]) -> str:
    head = ("# Reserved peak: estimate against the caching-allocator model\n\n"
            "Produced by `hpcmem validate trace --reserved` over estimator/cases/*.yaml: each traced step's "
            "device stream replayed through hpcmem/estimate/caching_allocator.py with cuBLAS/cuBLASLt workspaces "
            "(hpcmem/trace/replay.py), default and expandable_segments; the case estimated once per mode. "
            "err % = 100·(estimate − model)/model; \"slack only\" puts the estimate's reserved − allocated on the "
            "traced allocated peak; \"beyond ± spread\" is the distance outside the estimate ± half the block it says "
            "it cannot place (the head's [V, H] gradient, Reward's embedding gradient, under LoRA a decoder layer's "
            "largest block; 0 inside), over the cases that carry one and those that do not. The cases with images "
            "are the \"images\" rows, apart: an image job's reserved peak is not held to these figures (its estimate "
            "says so in a warning); the largest errors listed are the text cases'.\n\n")
    tail = "\n\nLargest errors:\n\n" + "\n".join(f"- {p['case']} ({p['mode']}): {p['err_pct']:+.2f} %" for p in worst)
    return head + render(rows) + tail + "\n"

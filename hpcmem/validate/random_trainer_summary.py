"""The records of the real-trainer oracle (hpcmem.validate.random_trainer), counted: verdicts, peak verdicts, and
the discrepancies grouped by cause (one example id each).

    python -m hpcmem.validate.random_trainer_summary estimator/random/trainer.jsonl

hpcmem's side of each record is taken again from today's code (random_trainer.rescore); the trainer's is as stored.

A cause is the reason with its particulars masked: quoted names, numbers and model types become placeholders, so
"Module 'out_proj' is incompatible with Mamba-based models (model_type='nemotron_h')" and the same sentence for
falcon_h1 are one cause.
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from hpcmem.validate.random_trainer import rescore

DISCREPANCIES = ("missed refusal", "false refusal", "hpcmem crashed")


def cause(text: str) -> str:
    text = re.sub(r"<class '[^']*'>", "<class>", text)
    text = re.sub(r"'[^']*'|\"[^\"]*\"|`[^`]*`", "'…'", text)
    text = re.sub(r"\{[^}]*\}|\[[^\]]*\]", "{…}", text)
    text = re.sub(r"\d+(\.\d+)?", "N", text)
    return text[:110]


def summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    verdicts = Counter(r.get("verdict") for r in records)
    peaks = Counter(r["peak"]["verdict"] for r in records if "peak" in r)
    groups: dict[tuple[str, str], list[str]] = defaultdict(list)
    for r in records:
        v = r.get("verdict")
        if v == "missed refusal":
            groups[(v, cause(r["trainer"]["reason"]))].append(r["id"])
        elif v in ("false refusal", "declined", "hpcmem crashed"):
            groups[(v, cause(r.get("hpcmem_refused", "")))].append(r["id"])
        elif v in ("shrink failed", "not run on CPU", "oracle timed out", "draw failed"):
            groups[(v, cause(r.get("trainer", {}).get("reason", "") or r.get("why", "")))].append(r["id"])
    for r in records:
        p = r.get("peak", {})
        if p and p["verdict"] != "within 1 %":
            groups[("peak " + p["verdict"], cause(p.get("why", "") or f"{p.get('delta_pct')} %"))].append(r["id"])
    deltas = [abs(r["peak"]["delta_pct"]) for r in records if "delta_pct" in r.get("peak", {})]
    return {"n": len(records), "verdicts": dict(verdicts), "peaks": dict(peaks),
            "max_abs_delta_pct": max(deltas) if deltas else None,
            "causes": [{"verdict": v, "cause": c, "count": len(ids), "example": ids[0], "types": _types(records, ids)}
                       for (v, c), ids in sorted(groups.items(), key=lambda kv: (kv[0][0], -len(kv[1])))]}


def _types(records: list[dict[str, Any]], ids: list[str]) -> list[str]:
    by_id = {r["id"]: r for r in records}
    return sorted({by_id[i].get("job", {}).get("model_type", "?") for i in ids})


if __name__ == "__main__":
    recs = [rescore(json.loads(line)) for line in Path(sys.argv[1]).read_text().splitlines() if line.strip()]
    print(json.dumps(summary(recs), indent=1))

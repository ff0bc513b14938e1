"""`hpcmem validate random --report`: every stored random-job record scored against today's estimate, a table per
trainer, technique and model type, estimator/random/REPORT.md, and each discrepancy kept as a case in
estimator/random/cases.yaml (the job is `draw(seed, index)`; its cause is "unexplained" until someone names it — a
named cause is kept when the file is written again).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from hpcmem.estimate.learned_range import OUTSIDE
from hpcmem.validate.coverage import EVAL_LAYERS
from hpcmem.validate.random_jobs import DEEP_FROM, DEEPEST_SEEDS, DEPTHS, RANDOM_LAYERS
from hpcmem.validate.random_props import properties_record
from hpcmem.validate.random_trace import OUTSIDE_HELD, WITHIN_PCT, score
from hpcmem.validate.random_trainer import rescore as trainer_rescore

# verdicts that are discrepancies of the estimate (a case each); the rest are agreement or the instruments' limits
DISCREPANCIES = ("over 3 %", "missed refusal", "false refusal", "estimate crashed", "hpcmem crashed", "fails")
UNEXPLAINED = "unexplained"


def is_case(s: dict[str, Any]) -> bool:
    """A discrepancy kept as a case: a verdict of DISCREPANCIES, or a number outside the held range that missed — the
    warning says the estimate cannot stand behind it, not that the range is the cause (a job may warn of its LoRA
    dropout and miss for its experts)."""
    return s["verdict"] in DISCREPANCIES or (s["verdict"] == OUTSIDE_HELD and not s.get("held_within"))


def technique(job: dict[str, Any]) -> str:
    s = job["settings"]
    kind = ("dora" if s.get("use_dora") else "lora") if s.get("use_peft") else "full"
    return f"{kind} {'gc' if s.get('gradient_checkpointing', True) else 'gc off'}"


def made(scored: dict[str, Any]) -> str:
    """How the estimate made the layers' terms: derived or learned (the estimate's `made` says more)."""
    return str((scored.get("estimate") or {}).get("made") or "refused").split()[0]


def rescore(oracle: str, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each record scored now (the trace's stored numbers against today's estimate; properties checked again)."""
    scorer: Callable[[dict[str, Any]], dict[str, Any]] = score if oracle == "trace" else (
        lambda rec: properties_record(rec["job"]))
    out = []
    for rec in records:
        if "job" not in rec:                        # a job that could not be drawn, or a worker that timed out
            out.append({"id": rec["id"], "verdict": "trace failed", "why": rec.get("outcome", "")})
            continue
        if oracle == "trainer":
            # the trainer's outcome as measured, hpcmem's side taken again from today's code
            got = trainer_rescore(rec)
            why = got.get("hpcmem_refused") or (got.get("trainer") or {}).get("reason") or rec.get("why", "")
            out.append({"id": rec["id"], "verdict": got.get("verdict", "recorded"), "why": why, "job": rec["job"],
                        "seconds": rec.get("seconds")})
            continue
        got = scorer(rec)
        out.append({**got, "job": rec["job"], "seconds": rec.get("seconds")})
    return out


def depth_group(s: dict[str, Any]) -> str:
    """"12 layers, seeds ≥ 5": a scored record's cut depth, apart by whether its seed drew the depth."""
    job = s["job"]
    seeds = f"seeds ≥ {DEEP_FROM}" if int(job.get("seed", 0)) >= DEEP_FROM else f"seeds 1–{DEEP_FROM - 1}"
    return f"{int(job['layers']):2d} layers, {seeds}"


def _row(name: str, scored: list[dict[str, Any]]) -> str:
    verdicts = Counter(s["verdict"] for s in scored)
    numbers = [s for s in scored if "err_pct" in s]
    within = verdicts["within 3 %"]
    worst = max(numbers, key=lambda s: max(abs(s["err_pct"]), abs(s.get("reserved_err_pct", 0))), default=None)
    worst_txt = (f"{worst['err_pct']:+.2f} / {worst.get('reserved_err_pct', float('nan')):+.2f} ({worst['id']})"
                 if worst else "")
    refusals = verdicts["parity"]
    mism = verdicts["missed refusal"] + verdicts["false refusal"]
    return (f"| {name} | {len(scored)} | {len(numbers)} | {within} | {verdicts['over 3 %']} | {_outside(scored)} | "
            f"{refusals} | {mism} | {verdicts['declined']} | {verdicts['not traced'] + verdicts['trace failed']} | "
            f"{worst_txt} |")


def _outside(scored: list[dict[str, Any]]) -> str:
    """"n (k within 3 %)": the jobs outside a learned profile's held range, and how many of them the number met."""
    outside = [s for s in scored if s["verdict"] == OUTSIDE_HELD]
    return f"{len(outside)} ({sum(bool(s.get('held_within')) for s in outside)})" if outside else "0"


HEAD = ("| {what} | jobs | scored | within 3 % | over 3 % | outside held range (of them within 3 %) | both refuse | "
        "refusal mismatch | declined | not traced / failed | worst alloc / reserved err % (id) |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|")


def table(scored: list[dict[str, Any]], key: Callable[[dict[str, Any]], str], what: str) -> str:
    """`key` reads a scored record (its `job`, its `estimate`)."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for s in scored:
        if "job" in s:
            groups.setdefault(key(s), []).append(s)
    return "\n".join([HEAD.format(what=what)] + [_row(k, v) for k, v in sorted(groups.items())] +
                     [_row("all", [s for s in scored if "job" in s])])


def properties_markdown(scored: list[dict[str, Any]], n_types: int) -> str:
    """The properties oracle's summary: how many jobs hold, fail or are refused, and each failure."""
    verdicts = Counter(s["verdict"] for s in scored)
    lines = ["# Random jobs against the estimate's properties", "",
             f"{len(scored)} jobs over {n_types} model types (hpcmem/validate/random_props.py: components ≥ 0, "
             "reserved ≥ allocated, peaks non-decreasing in length, batch and LoRA rank).", "",
             "| verdict | jobs |", "|---|---|"] + [f"| {k} | {v} |" for k, v in verdicts.most_common()] + [""]
    lines += [f"- {s['id']} {s['job']['trainer']} {s['job']['model_type']}: {'; '.join(s.get('failures') or [])}"
              for s in scored if s["verdict"] in ("fails", "estimate crashed")]
    return "\n".join(lines) + "\n"


def report_markdown(oracle: str, scored: list[dict[str, Any]], versions: dict[str, str], n_types: int,
                    stale: int = 0) -> str:
    if oracle == "properties":
        return properties_markdown(scored, n_types)
    verdicts = Counter(s["verdict"] for s in scored)
    secs = [s["seconds"] for s in scored if s.get("seconds")]
    lines = [f"# Random jobs against the {oracle}", "",
             f"Produced by `hpcmem validate random --oracle {oracle} --report` (hpcmem/validate/random_jobs.py says "
             "what a random job is: every derived or learned type at full width and at most "
             f"{RANDOM_LAYERS} decoder layers — from seed {DEEP_FROM} on one of {', '.join(map(str, DEPTHS))}, seed "
             f"{', '.join(map(str, sorted(DEEPEST_SEEDS)))} at the coverage sweep's {EVAL_LAYERS} — any "
             "trainer and technique a user can set). err % = 100·(estimate − trace)/trace, allocated tensor peak "
             "and reserved peak (the trace's caching-allocator model, default mode); a job is within 3 % when both "
             f"are. The estimate is today's, recomputed from each stored job. Versions: "
             f"{', '.join(f'{k} {v}' for k, v in sorted(versions.items())) or 'n/a'}.", "",
             f"{len(scored)} jobs over {n_types} model types; trace wall time {sum(secs):.0f} s "
             f"(median {sorted(secs)[len(secs) // 2] if secs else 0:.1f} s per job)." + (
                 f" {stale} of the records are no longer today's draw of their id (the stream follows the types this "
                 "hpcmem covers); each is scored as the job it ran, and `--redraw` runs today's draw in its place."
                 if stale else ""), "",
             "| verdict | jobs |", "|---|---|"] + [f"| {k} | {v} |" for k, v in verdicts.most_common()]
    lines += ["", "Verdicts: *within / over 3 %* both ran; *both refuse* hpcmem and the real code refuse (parity); "
              "*missed refusal* hpcmem estimates a job the real TRL/peft/transformers code raises on; *false refusal* "
              "hpcmem's TRL rules refuse a job the real code runs; *declined* the estimate says it cannot stand "
              "behind the job (a learned profile's missing cell, fp32 compute) and gives no number; *outside held "
              "range* both ran and the estimate gives a number but warns it lies outside where the learned profile "
              "was held against a trace (row length, technique, LoRA variant: hpcmem/estimate/learned_range.py) — "
              "scored, counted apart, with how many of them were within 3 % anyway; *not traced* the trace cannot "
              "run it on CPU (fp16); *trace failed* the trace's own failure or timeout. GRPO, RLOO and distillation: "
              "the trace replaces their generation with fixed completions, so their estimate is scored without its "
              "generation instants (hpcmem/validate/random_trace.py `as_traced`; those instants are held to a trace "
              "with generation on elsewhere).", "",
              "## Per trainer", "", table(scored, lambda s: s["job"]["trainer"], "trainer"), "",
              "## Per technique", "", table(scored, lambda s: technique(s["job"]), "technique"), "",
              "## Derived or learned layer terms", "", table(scored, made, "layer terms"), "",
              "## Per depth", "",
              f"Decoder layers of the cut. From seed {DEEP_FROM} on the depth is drawn from its own stream, apart from "
              "every other choice of the job, so those rows differ by depth alone; seeds 1–4 are all at "
              f"{RANDOM_LAYERS}. The allocator's slack is a larger share of a shallow cut's reserved peak than of a "
              "real model's.", "", table(scored, depth_group, "depth"), "",
              "## Per model type", "", table(scored, lambda s: s["job"]["model_type"], "model type"), "",
              "## Discrepancies by class", "",
              "Each job beyond 3 % (over 3 %, or outside the held range and over 3 %), by what kind of miss it is "
              "(hpcmem/validate/random_report.py `discrepancy_class`; its cause where one is named: "
              "estimator/random/cases.yaml).", "", "| class | jobs |", "|---|---|",
              *(f"| {k} | {n} |" for k, n in Counter(discrepancy_class(s) for s in scored if is_case(s)).most_common()),
              "",
              "## Discrepancies", "", "estimator/random/cases.yaml keeps each with its cause.", ""]
    for s in sorted((s for s in scored if s["verdict"] in DISCREPANCIES),
                    key=lambda s: (s["verdict"], -abs(s.get("err_pct", 0)))):
        job = s.get("job") or {}
        lines.append(f"- {s['id']} {job.get('trainer')} {job.get('model_type')} {technique(job) if job else ''}: "
                     f"{s['verdict']} — {str(s.get('why') or s.get('failures'))[:220]}")
    outside = [s for s in scored if s["verdict"] == OUTSIDE_HELD and not s.get("held_within")]
    if outside:
        lines += ["", "## Outside held range and over 3 %", "",
                  "The estimate warned it cannot stand behind these numbers; each is still a case in cases.yaml (the "
                  "warning is not necessarily the cause).", ""]
        lines += [f"- {s['id']} {s['job'].get('trainer')} {s['job'].get('model_type')} {technique(s['job'])}: "
                  f"{str(s.get('why'))[:220]}" for s in sorted(outside, key=lambda s: -abs(s.get("err_pct", 0)))]
    fails = [s for s in scored if s["verdict"] == "trace failed"]
    if fails:
        lines += ["", "## Trace failures", ""] + [f"- {s['id']}: {str(s.get('why'))[:220]}" for s in fails]
    return "\n".join(lines) + "\n"


def discrepancy_class(s: dict[str, Any]) -> str:
    """What kind of miss a scored job is, read off its score alone (always current, unlike a named `cause`): the
    learned profile's range it lies outside, a miss of the reserved peak alone (the allocator's slack is a fitted rule:
    hpcmem.estimate.allocator), or of the allocated peak — over or under, at the same phase as the trace's peak or
    another — or a refusal mismatch."""
    verdict = s["verdict"]
    if "err_pct" not in s:
        return verdict
    est = s.get("estimate") or {}
    held = est.get("not_held") or []
    if verdict == OUTSIDE_HELD and held:
        # every range the job lies outside, in one order (a job past two of them is not the first one's alone)
        reasons = {_held_reason(line) for line in held}
        return "outside held range: " + " + ".join(r for r in HELD_REASONS if r in reasons)
    err, res = s["err_pct"], s.get("reserved_err_pct")
    if abs(err) <= WITHIN_PCT:
        return f"reserved only ({'under' if (res or 0) < 0 else 'over'}): the allocator slack rule"
    same = _phase_key(str(est.get("phase") or "")) == _phase_key(str(s.get("traced_phase") or ""))
    where = "at the trace's peak" if same else "at another instant than the trace's peak"
    return f"allocated {'under' if err < 0 else 'over'}, {where}"


HELD_REASONS = (*OUTSIDE, "other")


def _held_reason(line: str) -> str:
    """The range a "not held" warning names, by the words hpcmem.estimate.learned_range writes into it (`OUTSIDE`)."""
    return next((label for label, words in OUTSIDE.items() if words in line), "other")


def _phase_key(phase: str) -> str:
    """The estimate's and the trace's names of an instant, reduced to what both say: forward / backward / head."""
    p = phase.lower()
    for key in ("reference", "lm head", "embeddings", "optimizer", "backward", "forward"):
        if key in p:
            return key
    return p


def cases(scored: list[dict[str, Any]], oracle: str, old: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One case per discrepancy, causes already named in `old` kept — not a placeholder that starts "unexplained"
    (earlier files carried such notes; each case's `class`, read off its score, replaces them)."""
    named = {(c.get("oracle", "trace"), c["id"]): c.get("cause", UNEXPLAINED) for c in old
             if not str(c.get("cause", UNEXPLAINED)).startswith(UNEXPLAINED)}
    out = [c for c in old if c.get("oracle", "trace") != oracle]
    for s in scored:
        if not is_case(s):
            continue
        seed, index = map(int, re.fullmatch(r"s(\d+)-(\d+)", s["id"]).groups())
        job = s.get("job") or {}
        out.append({"id": s["id"], "oracle": oracle, "seed": seed, "index": index, "trainer": job.get("trainer"),
                    "model_type": job.get("model_type"), "layer_terms": made(s), "verdict": s["verdict"],
                    "failed": str(s.get("why") or "; ".join(s.get("failures") or []))[:300],
                    "class": discrepancy_class(s) if oracle == "trace" else s["verdict"],
                    "cause": named.get((oracle, s["id"]), UNEXPLAINED)})
    return sorted(out, key=lambda c: (c["oracle"], c["seed"], c["index"]))


def read_cases(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return list((yaml.safe_load(path.read_text()) or {}).get("cases") or [])


def write_cases(path: Path, items: list[dict[str, Any]]) -> None:
    head = ("# Discrepancies of random jobs (hpcmem validate random --report): each job is draw(seed, index) of\n"
            "# hpcmem/validate/random_jobs.py; `class` is read off the score each time; `cause` is unexplained until\n"
            "# someone names it (kept on rewrite).\n")
    path.write_text(head + yaml.safe_dump({"cases": items}, sort_keys=False, allow_unicode=True, width=120))


def summary(scored: list[dict[str, Any]]) -> dict[str, Any]:
    verdicts = Counter(s["verdict"] for s in scored)
    numbers = [s for s in scored if "err_pct" in s]
    return {"jobs": len(scored), "verdicts": dict(verdicts), "scored": len(numbers),
            "within_pct": WITHIN_PCT,
            "max_abs_err_pct": max((abs(s["err_pct"]) for s in numbers), default=None),
            "max_abs_reserved_err_pct": max((abs(s.get("reserved_err_pct", 0)) for s in numbers), default=None)}

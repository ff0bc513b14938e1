"""Which model types hpcmem covers, and how: every type of transformers' causal-LM mapping, classified.

The classification is data (hpcmem/models/coverage.json, one entry per type): `decoder` (decoder-only text),
`multimodal` (a family whose text decoder a text fine-tune trains: `backbone`), or `not_applicable` (the reason). A
decoder or backbone is `refused` where a GPU run's memory cannot be held to a trace (the reason names the kernels);
otherwise its status is `derived` (a family descriptor: hpcmem.models.config.ARCHITECTURES) or `learned` (a learned
profile: `hpcmem models learn CONFIG`, hpcmem.models.profile).

The installed transformers' mapping is read from its source (transformers/models/auto/modeling_auto.py
`MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`) without importing transformers; a type there and not in coverage.json is
`unclassified` (tests/models/test_coverage_torch.py fails on it).
"""

from __future__ import annotations

import ast
import importlib.util
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from hpcmem.datapath import PACKAGE_DIR, estimator_dir
from hpcmem.models.config import ARCHITECTURES
from hpcmem.models.coverage_vlm import (IMAGE_TEXT_MAPPING_NAME, NO_IMAGE_INPUT, TEXT_PART_REFUSED, derived_reason,
                                        vision_language_reason, vision_language_types)
from hpcmem.models.vision import VISION_LANGUAGE

MAPPING_NAME = "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"
STATUSES = ("derived", "learned", "refused", "not applicable", "unclassified")


@lru_cache(maxsize=1)
def classification() -> dict[str, Any]:
    return json.loads((PACKAGE_DIR / "models" / "coverage.json").read_text(encoding="utf-8"))


def installed_mapping(name: str = MAPPING_NAME) -> dict[str, str] | None:
    """model_type → class of the installed transformers' mapping `name` (causal LM by default; IMAGE_TEXT_MAPPING_NAME
    for vision-language), None when transformers is not installed."""
    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        return None
    source = Path(next(iter(spec.submodule_search_locations))) / "models" / "auto" / "modeling_auto.py"
    return mapping_from_source(source.read_text(encoding="utf-8"), name)


def mapping_from_source(text: str, name: str = MAPPING_NAME) -> dict[str, str]:
    for node in ast.parse(text).body:
        if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
                and isinstance(node.value, ast.Call) and node.value.args):
            return dict(ast.literal_eval(node.value.args[0]))
    raise ValueError(f"{name} not found in transformers' modeling_auto.py")


def type_status(model_type: str, entry: dict[str, Any] | None) -> tuple[str, str]:
    """(status, reason) of one type."""
    if entry is None:
        return "unclassified", "not in hpcmem/models/coverage.json (transformers is newer than this table)"
    if entry["class"] == "not_applicable":
        return "not applicable", entry["reason"]
    if "refused" in entry:
        return "refused", entry["refused"]
    decoder = entry.get("backbone", model_type)
    needs = f"; trains only with {_settings(entry['requires'])}: {entry['requires_reason']}" if "requires" in entry else ""
    if decoder in ARCHITECTURES:
        return "derived", f"family descriptor {decoder!r} (hpcmem/models/config.py){needs}"
    reason = "needs a learned profile: hpcmem models learn CONFIG (torch; about a minute)"
    return "learned", (f"{reason}; {entry['kernels']}" if entry.get("kernels") else reason) + needs


def _settings(requires: dict[str, Any]) -> str:
    return ", ".join(f"{k}: {json.dumps(v)}" for k, v in requires.items())


def text_part_refusal(model_type: str) -> str | None:
    """Why an image-text type refused for its text part (hpcmem.models.coverage_vlm `TEXT_PART_REFUSED`) is: the text
    type's coverage.json refusal and the settings its trainer runs only with; None for any other type."""
    text = TEXT_PART_REFUSED.get(model_type)
    if text is None:
        return None
    entry = classification()["types"][text]
    needs = f"; it trains only with {_settings(entry['requires'])}: {entry['requires_reason']}" \
        if "requires" in entry else ""
    return (f"vision-language only (image-text-to-text: {vision_language_types().get(model_type, model_type)}): its "
            f"text part {text} is refused: {entry['refused']}{needs}")


def required_settings(model_type: str) -> dict[str, Any]:
    """The settings a type's real trainer runs only with (coverage.json "requires"; {} for most types): the other
    jobs raise in TRL or transformers, for the entry's "requires_reason"."""
    entry = classification()["types"].get(model_type) or {}
    return dict(entry.get("requires", {}))


def settings_beside_checkpointing(model_type: str) -> dict[str, Any]:
    """The required settings a traced or swept job carries whatever its checkpointing (which its cell sets)."""
    return {k: v for k, v in required_settings(model_type).items() if k != "gradient_checkpointing"}


def requirement_problems(model_type: str, train: Any, config: dict[str, Any] | None) -> list[str]:
    """Why a job of this type would not run (hpcmem.job.rules.check_job): a required setting the job does not have. A
    TrainSpec field left None takes the model config's value, as TRL does (router_aux_loss_coef)."""
    requires = required_settings(model_type)
    if not requires:
        return []
    problems = []
    for name, want in requires.items():
        got = getattr(train, name)
        if got is None:
            got = (config or {}).get(name)
        if got != want:
            reason = classification()["types"][model_type]["requires_reason"]
            problems.append(f"model_type {model_type!r} trains only with {name}: {json.dumps(want)} (got "
                            f"{json.dumps(got)}): {reason}")
    return problems


def coverage_rows(mapping: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """One row per type of the installed mapping (else of the table), with class, status and reason."""
    table = classification()["types"]
    mapping = mapping if mapping is not None else installed_mapping()
    names = list(mapping) if mapping is not None else list(table)
    rows = []
    for name in names:
        entry = table.get(name)
        status, reason = type_status(name, entry)
        rows.append({"model_type": name, "task": "causal-lm", "causal_lm": (mapping or {}).get(name) or (entry or {}).get("causal_lm", ""),
                     "class": entry["class"] if entry else "unclassified", "backbone": (entry or {}).get("backbone"),
                     "status": status, "reason": reason})
    return rows


def vision_language_rows(mapping: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """One row per image-text-to-text type (the installed mapping, else the table): refused, or — where transformers
    also has a causal-LM class — the text decoder's status, said to leave the images out."""
    mapping = mapping if mapping is not None else installed_mapping(IMAGE_TEXT_MAPPING_NAME)
    table = classification()["types"]
    rows = []
    for name, cls in (mapping if mapping is not None else vision_language_types()).items():
        entry = table.get(name)
        if name in VISION_LANGUAGE:
            status, reason = "derived", derived_reason(name)
        elif name in NO_IMAGE_INPUT:
            status, reason = "not applicable", vision_language_reason(name)
        elif entry is None:
            status, reason = "refused", (text_part_refusal(name) or vision_language_reason(name)
                                         or f"vision-language only ({cls}): not modelled")
        else:
            status, reason = type_status(name, entry)
            reason = f"text decoder only, images not modelled: {reason}"
        rows.append({"model_type": name, "task": "image-text-to-text", "image_text_to_text": cls,
                     "class": "vision_language", "backbone": (entry or {}).get("backbone"), "status": status,
                     "reason": reason})
    return rows


def refusal(model_type: str) -> str | None:
    """Why hpcmem refuses a type (not applicable, refused, or vision-language only), or None."""
    entry = classification()["types"].get(model_type)
    vision_only = (text_part_refusal(model_type) or vision_language_reason(model_type)) if entry is None else None
    if vision_only:
        return f"{'not applicable' if model_type in NO_IMAGE_INPUT else 'refused'}: {vision_only}"
    status, reason = type_status(model_type, entry)
    return f"{status}: {reason}" if status in ("refused", "not applicable") else None


# -- the coverage sweep's records (estimator/coverage.jsonl) -------------------------------------------------------
def sweep_records() -> list[dict[str, Any]]:
    path = estimator_dir() / "coverage.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


SHIPPED_SUMMARY = PACKAGE_DIR / "models" / "coverage_measured.json"
# image-text types held with their images: model_type → cases, trainers, techniques, resolutions, max |err| %, held
# (hpcmem.validate.coverage_vlm summarises the stored image traces; `hpcmem validate coverage` writes this file)
SHIPPED_VLM_SUMMARY = PACKAGE_DIR / "models" / "coverage_vlm_measured.json"


def vlm_summary() -> dict[str, dict[str, Any]]:
    """The image-text types' measured summary shipped with the package (empty before a sweep wrote it)."""
    if not SHIPPED_VLM_SUMMARY.is_file():
        return {}
    return json.loads(SHIPPED_VLM_SUMMARY.read_text(encoding="utf-8"))


def sweep_summary(records: list[dict[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
    """model_type → {"techniques": n, "max_abs_err_pct": x, "made": derived|learned} over the sweep's cases: from the
    records (estimator/coverage.jsonl, in a checkout), else the summary shipped with the package
    (models/coverage_measured.json, which `hpcmem validate coverage` writes beside COVERAGE.md)."""
    if records is None:
        records = sweep_records()
        if not records and SHIPPED_SUMMARY.is_file():
            return json.loads(SHIPPED_SUMMARY.read_text(encoding="utf-8"))
    out: dict[str, dict[str, Any]] = {}
    for rec in records:
        if "err_pct" not in rec:
            continue
        cur = out.setdefault(rec["model_type"], {"techniques": 0, "max_abs_err_pct": 0.0, "made": rec.get("made")})
        cur["techniques"] += 1
        cur["max_abs_err_pct"] = round(max(cur["max_abs_err_pct"], abs(rec["err_pct"])), 3)
    return out


def held_label(model_type: str) -> str:
    """Where the sweep's learned profile of a type (estimator/coverage-profiles) is held: "≤ 32,768: full (gc, no gc),
    lora (gc, no gc), dora (gc, no gc); 1–16 rows" (tokens per row, each technique its own longest where they differ;
    the rows per micro-batch its rows check held, or "2 rows (rows not checked)"); a
    format-2 profile "≤ 1,024 (format 2)"; "" without a profile (derived types)."""
    path = estimator_dir() / "coverage-profiles" / f"{model_type}.json"
    if not path.is_file():
        return ""
    doc = json.loads(path.read_text(encoding="utf-8"))
    held = doc.get("provenance", {}).get("held")
    if doc.get("format") == "hpcmem-learned-profile/2":
        return "≤ 1,024 (format 2)"
    if not held or not held.get("techniques"):
        return "not checked"
    by_length: dict[int, dict[str, list[str]]] = {}
    for name, n in held["techniques"].items():
        technique, gc = name.split(" ", 1)
        by_length.setdefault(n, {}).setdefault(technique, []).append(gc)
    lo, hi = held.get("rows_held") or (held.get("rows", 2),) * 2
    rows = f"{lo}–{hi} rows" if lo != hi else f"{lo} rows" + ("" if "rows_held" in held else " (rows not checked)")
    return "; ".join(f"≤ {n:,}: " + ", ".join(f"{t} ({', '.join(g)})" for t, g in kinds.items())
                     for n, kinds in sorted(by_length.items(), reverse=True)) + f"; {rows}"


def summary_to_ship(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """What the package carries of the sweep (models/coverage_measured.json): each type's summary and, for a learned
    type, where its sweep profile is held — so `hpcmem models coverage` from a wheel shows the measured accuracy."""
    out = sweep_summary(records)
    for model_type, entry in out.items():
        label = held_label(model_type)
        if label:
            entry["held"] = label
    return dict(sorted(out.items()))


def shipped_profile_types() -> set[str]:
    """Model types a profile ships for in the package (hpcmem/profiles/<type>-<hash>.json: those exact configs)."""
    folder = PACKAGE_DIR / "profiles"
    return {p.name.rsplit("-", 1)[0] for p in folder.glob("*.json")} if folder.is_dir() else set()


def use_label(row: dict[str, Any], shipped: set[str] | None = None) -> str:
    """What the status means to a user: ready (estimate it now), learn first (`hpcmem models learn CONFIG` makes the
    profile the estimate needs), or refused / not applicable with the reason's first words."""
    status = row["status"]
    if row.get("task") == "image-text-to-text" and status in ("derived", "learned"):
        return "ready, with images" if row["model_type"] in VISION_LANGUAGE else "text-only jobs; images not modelled"
    if status == "derived":
        return "ready"
    if status == "learned":
        shipped = shipped_profile_types() if shipped is None else shipped
        return ("ready for the catalog's configs; others: models learn" if row["model_type"] in shipped else
                "run `hpcmem models learn CONFIG` first")
    return status


def images_held_label(m: dict[str, Any] | None) -> str:
    """An image-text type's column: at how many resolutions its image cases are held, or why not."""
    if not m:
        return ""
    n = len(m.get("resolutions", []))
    if m.get("held"):
        return f"{n} resolutions"
    if m.get("held_fixed"):
        return "1 (fixed by processor)"
    return f"not held ({n} res.)"


def render_coverage(rows: list[dict[str, Any]]) -> str:
    shipped = shipped_profile_types()
    lines = [f"{'model type':28} {'class':15} {'status':15} {'max |err|':>9}  {'held at (tokens/row)':22}  "
             f"{'use':38}  reason"]
    for r in rows:
        m = r.get("measured")
        err = f"{m['max_abs_err_pct']:.2f} %" if m else "-"
        reason = r["reason"] if len(r["reason"]) <= 70 else r["reason"][:67] + "..."
        held = (held_label(r["model_type"]) or (m or {}).get("held", "")) if r["status"] == "learned" else ""
        if r.get("task") == "image-text-to-text":
            held = images_held_label(m)
        held = held if len(held) <= 22 else held[:19] + "..."
        use = use_label(r, shipped)
        lines.append(f"{r['model_type']:28} {r['class']:15} {r['status']:15} {err:>9}  {held:22}  {use:38}  {reason}")
    for task in dict.fromkeys(r.get("task", "causal-lm") for r in rows):
        counts: dict[str, int] = {}
        mine = [r for r in rows if r.get("task", "causal-lm") == task]
        for r in mine:
            counts[r["status"]] = counts.get(r["status"], 0) + 1
        lines.append(f"{task}: {len(mine)} types: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    vlm = [r.get("measured") or {} for r in rows if r.get("task") == "image-text-to-text"]
    if vlm:
        held, fixed = sum(bool(m.get("held")) for m in vlm), sum(bool(m.get("held_fixed")) for m in vlm)
        lines.append(f"image-text-to-text with images: {held} held within 3 % at ≥ 2 resolutions, {fixed} more at "
                     "the one resolution their processor makes of every image")
    lines.append("`--json` for the full reasons; max |err|: estimate vs trace over the sweep's techniques (image-text: "
                 "over the stored image traces, estimator/COVERAGE.md)")
    return "\n".join(lines)

"""Vision-language coverage, measured: every stored image-text trace (estimator/traces/vlm-*.jsonl, the trace matrices
`hpcmem validate trace --cases estimator/cases/vlm-*.yaml` wrote) re-estimated and summarised per model type.

A resolution is what the type's processor makes of one image: its vision patches and image tokens
(hpcmem.job.images.image_geometry, from the case's image size and the config's resolution settings). Two image sizes
that the processor resizes to the same grid are one resolution; a larger tower input size in the config is another. A
type is "held" when every stored case of it is within HELD_PCT of its trace's allocated peak and its cases span at
least MIN_RESOLUTIONS resolutions. A type whose processor makes the same grid of every image size (FIXED_PROBE: a
small and a large image give the same patches and tokens; CLIP at 336 px, Gemma 3's SigLIP at 896 px) reaches other
resolutions only through another config, and is counted apart when its one resolution is held. Allocated peaks only:
the reserved peak with images carries its own warning (README, "Vision-language jobs").
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from hpcmem.datapath import estimator_dir
from hpcmem.estimate.verdict import pct
from hpcmem.job.images import image_geometry
from hpcmem.models.coverage_vlm import trl_cannot_train
from hpcmem.validate.cases import case_job
from hpcmem.validate.trace import rescore
from hpcmem.validate.vlm_trainable import outcome as run_outcome

HELD_PCT = 3.0
MIN_RESOLUTIONS = 2
FIXED_PROBE = ((224, 224), (1344, 896))       # (height, width): a small and a large image


def image_trace_files(root: Path | None = None) -> list[Path]:
    """The stored image-text trace matrices (the CI subsets, copies of their cases, left out)."""
    return [f for f in sorted(((root or estimator_dir()) / "traces").glob("vlm-*.jsonl")) if not f.stem.endswith("-ci")]


def case_rows(files: list[Path] | None = None) -> list[dict[str, Any]]:
    """One row per stored image case: its model type, trainer, technique, image tokens per image, error %."""
    out = []
    for path in files if files is not None else image_trace_files():
        for r in rescore(path):
            job = case_job(r.record["case"])
            vision = job.model.vision
            if vision is None or not job.train.has_images:
                continue
            g = image_geometry(job.train, vision) if job.train.images_per_example else None
            out.append({"model_type": vision.model_type, "case": r.case_id, "file": path.name,
                        "trainer": r.trainer, "technique": r.technique,
                        "resolution": [g.patches, g.tokens] if g else None, "fixed": g is not None and fixed(job),
                        "err_pct": 100.0 * (r.estimated - r.traced) / r.traced})
    return out


def fixed(job: Any) -> bool:
    """The processor makes the same grid of a small and a large image (FIXED_PROBE)."""
    grids = {(g.patches, g.tokens) for g in (image_geometry(replace(job.train, image_height=h, image_width=w),
                                                            job.model.vision) for h, w in FIXED_PROBE)}
    return len(grids) == 1


def summary(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """model_type → cases, trainers, techniques, resolutions ([patches, image tokens] per image), whether every case's
    processor fixes the resolution, max |err| %, held (at ≥ MIN_RESOLUTIONS) and held_fixed (a fixed-resolution type
    held at its one)."""
    out: dict[str, dict[str, Any]] = {}
    for row in rows:
        cur = out.setdefault(row["model_type"], {"cases": 0, "trainers": set(), "techniques": set(),
                                                 "resolutions": set(), "fixed": True, "max_abs_err_pct": 0.0})
        cur["cases"] += 1
        cur["trainers"].add(row["trainer"])
        cur["techniques"].add(row["technique"])
        if row["resolution"]:
            cur["resolutions"].add(tuple(row["resolution"]))
        cur["fixed"] = cur["fixed"] and row["fixed"]
        cur["max_abs_err_pct"] = max(cur["max_abs_err_pct"], abs(row["err_pct"]))
    for cur in out.values():
        cur.update(trainers=sorted(cur["trainers"]), techniques=sorted(cur["techniques"]),
                   resolutions=[list(x) for x in sorted(cur["resolutions"])],
                   max_abs_err_pct=round(cur["max_abs_err_pct"], 3))
        within = cur["max_abs_err_pct"] <= HELD_PCT
        cur["held"] = within and len(cur["resolutions"]) >= MIN_RESOLUTIONS
        cur["held_fixed"] = within and not cur["held"] and cur["fixed"]
    return out


def resolutions(m: dict[str, Any]) -> str:
    fixed = " (fixed by the processor)" if m["fixed"] else ""
    return ", ".join(f"{p:,} / {t:,}" for p, t in m["resolutions"]) + fixed


OUTCOMES = ("held", "fixed", "one resolution", "over", "not measured")


def outcome(m: dict[str, Any] | None) -> str:
    """Where a type estimated with images stands (OUTCOMES), from its `summary` entry (None: no stored trace)."""
    if m is None:
        return "not measured"
    if m["held"] or m["held_fixed"]:
        return "held" if m["held"] else "fixed"
    return "one resolution" if m["max_abs_err_pct"] <= HELD_PCT else "over"


def trainable_lines(rows: list[dict[str, Any]], with_images: list[dict[str, Any]], held: list[str],
                    fixed_res: list[str], trainable: list[dict[str, Any]]) -> list[str]:
    """The held share of the types TRL can train, bounded by what the real trainer showed: types TRL cannot train
    (hpcmem.models.coverage_vlm `trl_cannot_train`) leave the denominator; a type not estimated with images is counted
    as trainable when TRL's SFTTrainer ran a step on it with text rows (hpcmem.validate.vlm_trainable: TRL takes its
    classes; its image rows are not tried), and as unknown when the run raised where text rows do not decide (a
    forward that needs images to run, a setting) or the tiny model did not build: the share lies between the one with
    every unknown trainable and the one with none."""
    runs = {r["model_type"]: r for r in trainable if r.get("trainer") == "sft"}
    derived = {r["model_type"] for r in with_images}
    refused = [r["model_type"] for r in rows if r["status"] != "not applicable" and trl_cannot_train(r["model_type"])]
    others = [r["model_type"] for r in rows if r["status"] != "not applicable" and r["model_type"] not in derived
              and r["model_type"] not in refused]
    ran = [t for t in others if t in runs and run_outcome(runs[t]) == "ran"]
    raised = [t for t in others if t in runs and run_outcome(runs[t]) == "raised"]
    unbuilt = [t for t in others if t in runs and run_outcome(runs[t]) == "not built"]
    untried = [t for t in others if t not in runs]
    most = len(derived) + len(others)            # every unknown trainable
    least = len(derived) + len(ran)              # only those shown
    h, hf = len(held), len(held) + len(fixed_res)
    return [
        f"Which types TRL 1.16 can train: {len(refused)} applicable types it cannot ({', '.join(refused)}: their "
        "rows say where the real trainer raises), so at most "
        f"{most} of the applicable types; every type estimated with images ({len(derived)}) is trainable (its "
        "traces ran TRL's own trainer with images). Of the other "
        f"{len(others)}, TRL's SFTTrainer ran one CPU step with text rows on a tiny model of {len(ran)} "
        f"({', '.join(ran) or 'none'}: counted as trainable, TRL takes their classes; their image rows were not "
        "tried; `hpcmem validate coverage --trainable`, estimator/vlm-trainable.jsonl); it raised on "
        f"{len(raised)} where text rows do not decide (a forward that needs images or other inputs to run, a "
        f"setting, a shrunk width: {', '.join(raised) or 'none'}), {len(unbuilt)} did not build as tiny models "
        f"({', '.join(unbuilt) or 'none'}) and {len(untried)} were not tried"
        f"{' (' + ', '.join(untried) + ')' if untried else ''}: unknown. So the held share of the types TRL can "
        f"train lies between {pct(100 * h / max(most, 1))} % (every unknown trainable: {h} of {most}) and "
        f"{pct(100 * h / max(least, 1))} % (only those shown: {h} of {least}) at two resolutions; with the "
        f"fixed-resolution ones between {pct(100 * hf / max(most, 1))} % and {pct(100 * hf / max(least, 1))} %.", ""]


def report_markdown(measured: dict[str, dict[str, Any]], rows: list[dict[str, Any]],
                    trainable: list[dict[str, Any]] | None = None) -> str:
    """COVERAGE.md's image-text section: every image-text-to-text type (`rows`: hpcmem.models.coverage
    vision_language_rows), its status, and for those estimated with images what the stored traces hold."""
    with_images = [r for r in rows if r["status"] == "derived"]
    applicable = [r for r in rows if r["status"] != "not applicable"]
    groups: dict[str, list[str]] = {k: [] for k in OUTCOMES}
    for r in with_images:
        groups[outcome(measured.get(r["model_type"]))].append(r["model_type"])
    held, fixed_res, one_res, over, unmeasured = (groups[k] for k in OUTCOMES)
    lines = ["", "## Image-text-to-text types (vision-language), held to the trace with images", "",
             "Every type of transformers' image-text-to-text mapping (the classes TRL loads for image-text "
             "fine-tuning). \"derived\" types are estimated with their images (vision tower, projector, image tokens); "
             "a \"learned\" or other status here is the text decoder's, images not counted; \"refused\" types say why. "
             "Measured: every stored image trace (estimator/traces/vlm-*.jsonl; hpcmem/validate/coverage_vlm.py) "
             "re-estimated now. A resolution is the vision patches and image tokens the processor makes of one "
             f"image; a type is held when every case is within {HELD_PCT:g} % of its trace's allocated peak over "
             f"≥ {MIN_RESOLUTIONS} resolutions.", "",
             f"Types: {len(rows)} ({len(applicable)} applicable); estimated with images: {len(with_images)}; held at "
             f"≥ {MIN_RESOLUTIONS} resolutions: {len(held)} ({pct(100 * len(held) / max(len(with_images), 1))} % of "
             f"those estimated with images, {pct(100 * len(held) / max(len(applicable), 1))} % of the applicable "
             f"types); {len(fixed_res)} more held at the one resolution their processor makes of every image "
             f"(with them {len(held) + len(fixed_res)}, "
             f"{pct(100 * (len(held) + len(fixed_res)) / max(len(applicable), 1))} % of the applicable types).", ""
             ] + trainable_lines(rows, with_images, held, fixed_res, trainable or []) + [
             "| outcome | types | which |", "|---|---|---|",
             f"| held (≥ {MIN_RESOLUTIONS} resolutions, within {HELD_PCT:g} %) | {len(held)} | {', '.join(held)} |",
             f"| within {HELD_PCT:g} %, the one resolution the processor makes | {len(fixed_res)} | "
             f"{', '.join(fixed_res)} |",
             f"| within {HELD_PCT:g} %, one resolution traced | {len(one_res)} | {', '.join(one_res)} |",
             f"| over {HELD_PCT:g} % | {len(over)} | {', '.join(over)} |",
             f"| not measured | {len(unmeasured)} | {', '.join(unmeasured)} |", "",
             "| model type | status | cases | trainers | techniques | resolutions (patches / image tokens per image) "
             "| max \\|err\\| % | note |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        m = measured.get(r["model_type"])
        note = "" if r["status"] == "derived" else r["reason"][:140].replace("|", "/")
        if m:
            lines.append(f"| {r['model_type']} | {r['status']} | {m['cases']} | {', '.join(m['trainers'])} | "
                         f"{', '.join(m['techniques'])} | {resolutions(m)} | "
                         f"{m['max_abs_err_pct']:.2f} | {note} |")
        else:
            lines.append(f"| {r['model_type']} | {r['status']} |  |  |  |  | not measured | {note} |")
    return "\n".join(lines) + "\n"

"""Which image-text-to-text types TRL's trainers take at all: the real trainer, one CPU step, on a tiny model of each
type built from its config class's defaults, with text rows.

    rec = run_type("kosmos-2.5")    # {"model_type", "trainer", "built", "ran", "reason", "raised_in", "seconds", …}

Every TRL 1.16 trainer that takes images (SFT, DPO, GRPO, RLOO) scores its tokens through TRL's fused LM head
(trl/trainer/utils.py `add_fused_lm_head._fused_forward`): it calls the model's backbone (`model.base_model`) with the
batch minus the labels and reads `last_hidden_state`, whatever the batch holds. A text row goes through that call as an
image row does, so a type whose backbone cannot answer it (no `last_hidden_state`; an encoder-decoder whose decoder
gets no input without labels) raises with text as with images, and one whose forward needs images to run
(`pixel_values` required) says nothing here: "ran" and "raised" are evidence only where the raise is not about the
missing images (hpcmem.models.coverage_vlm `TRL_REFUSES` names the types and why; tests/validate/test_vlm_trainable.py
holds each to its raise). A run with text rows shows the trainer takes the type's classes, not that its processor's
image rows train: a type that ran stays among those TRL can train. Where the forward ran under TRL's head given image
inputs but the type's processor may not make TRL's rows, the record also holds one step on image rows through that
processor (hpcmem.validate.vlm_image_rows), which decides.

The tiny model: hpcmem.validate.vlm_tiny; a shrink the class's validation refuses is recorded as not built, not as
TRL's verdict.
Records: estimator/vlm-trainable.jsonl (`hpcmem validate vlm-trainable`).
"""

from __future__ import annotations

import fcntl
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpcmem.datapath import estimator_dir
from hpcmem.trace.result import versions
from hpcmem.validate.trl_run import build_model, deadline, one_line, quiet, run_trl
from hpcmem.validate.vlm_image_call import IMAGE_INPUTS, image_call
from hpcmem.validate.vlm_image_rows import PROCESSORS, ROW_KINDS, image_rows
from hpcmem.validate.vlm_tiny import MAX_LENGTH, tiny_config

RECORDS = "vlm-trainable.jsonl"
SETTINGS = {"max_length": MAX_LENGTH, "per_device_train_batch_size": 1}
TIMEOUT_S = 240
MAX_PARAMS = 1_000_000_000  # what one CPU process trains with Adam in memory; more: a width the shrink left full size


def run_type(model_type: str, trainer: str = "sft") -> dict[str, Any]:
    """One record: TRL's `trainer`, one step on a tiny image-text model of `model_type` with text rows. Never
    raises."""
    start = time.perf_counter()
    rec: dict[str, Any] = {"model_type": model_type, "trainer": trainer, "settings": SETTINGS}
    try:
        config = tiny_config(model_type)
    except Exception as exc:  # noqa: BLE001 — the config class's refusal of its own defaults
        rec.update(built=False, ran=None, reason=f"config: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}")
        return _done(rec, start)
    params = _meta_params(config)
    if isinstance(params, str) or params > MAX_PARAMS:
        rec.update(built=False, ran=None, reason=f"shrunken model does not build: {params}" if isinstance(params, str)
                   else f"shrunken model does not build: still {params:,} parameters (over {MAX_PARAMS:,}: a width "
                   "the shrink does not name)")
        return _done(rec, start)
    with quiet(), deadline(TIMEOUT_S):
        try:
            verdict = run_trl(trainer, SETTINGS, config, steps=1, image_text=True)
        except TimeoutError:
            rec.update(built=None, ran=None, reason=f"timed out after {TIMEOUT_S} s")
            return _done(rec, start)
    built = not verdict.reason.startswith("shrunken model does not build")
    rec.update(built=built, ran=verdict.ran if built else None, reason=verdict.reason, raised_in=verdict.raised_in)
    if model_type in IMAGE_INPUTS and trainer == "sft":
        rec["image_call"] = _image_call(model_type)
    if model_type in PROCESSORS and trainer == "sft":
        rec["image_rows"] = {kind: _image_rows(model_type, kind) for kind in ROW_KINDS}
    return _done(rec, start)


def _meta_params(config: dict[str, Any]) -> int | str:
    """The tiny model's parameter count, built on the meta device (no memory), or why it does not build."""
    import torch

    with quiet():
        try:
            with torch.device("meta"):
                return sum(p.numel() for p in build_model(config, image_text=True).parameters())
        except Exception as exc:  # noqa: BLE001 — the shrink's limit, recorded as not built
            return f"{type(exc).__name__}: {one_line(exc)}"


def _image_call(model_type: str) -> dict[str, Any]:
    """hpcmem.validate.vlm_image_call's record, or why it did not run (the tiny model did not build, a timeout)."""
    with quiet(), deadline(TIMEOUT_S):
        try:
            return image_call(model_type)
        except TimeoutError:
            return {"ran": None, "reason": f"timed out after {TIMEOUT_S} s"}
        except Exception as exc:  # noqa: BLE001 — building the tiny model or its inputs: no verdict
            return {"ran": None, "reason": f"not built: {type(exc).__name__}: {one_line(exc)}"}


def _image_rows(model_type: str, kind: str) -> dict[str, Any]:
    """hpcmem.validate.vlm_image_rows' record for rows of `kind`, or why it did not run."""
    with quiet(), deadline(TIMEOUT_S):
        try:
            return image_rows(model_type, kind)
        except TimeoutError:
            return {"ran": None, "reason": f"timed out after {TIMEOUT_S} s"}
        except Exception as exc:  # noqa: BLE001 — building the tiny model, its processor or its rows: no verdict
            return {"ran": None, "reason": f"not built: {type(exc).__name__}: {one_line(exc)}"}


def _done(rec: dict[str, Any], start: float) -> dict[str, Any]:
    rec["versions"] = versions()
    rec["seconds"] = round(time.perf_counter() - start, 2)
    return rec


def run(types: list[str], trainer: str = "sft",
        progress: Callable[[int, int, dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """`run_type` for each type, each record replacing the stored one of its (type, trainer)."""
    out = []
    for i, model_type in enumerate(types):
        rec = run_type(model_type, trainer)
        out.append(rec)
        if progress:
            progress(i + 1, len(types), rec)
        write_records([rec])
    return out


def records_path() -> Path:
    return estimator_dir() / RECORDS


def load_records() -> list[dict[str, Any]]:
    path = records_path()
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def write_records(new: list[dict[str, Any]]) -> None:
    """The stored records with `new` in place of those of the same (type, trainer), sorted; under a lock on the
    file, so two runs over different types may share it."""
    path = records_path()
    with open(Path(tempfile.gettempdir()) / "hpcmem-vlm-trainable.lock", "w", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        keep = {(r["model_type"], r["trainer"]): r for r in load_records()}
        keep.update({(r["model_type"], r["trainer"]): r for r in new})
        lines = [json.dumps(keep[k], sort_keys=True) for k in sorted(keep)]
        tmp = path.with_suffix(".tmp")
        tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
        tmp.replace(path)


def outcome(rec: dict[str, Any]) -> str:
    """"ran", "raised" or "not built" (the shrink's limit or a timeout: no verdict): with text rows, or, where the
    record has it, TRL's head given image inputs (`image_call`, for types whose forward needs them to run), or, where
    it has that, TRL's trainer on image rows through the type's own processor (`image_rows`: "ran" when rows of any
    kind ran, "raised" when rows of every kind raised)."""
    rows = list((rec.get("image_rows") or {}).values())
    if rows:
        verdicts = {r.get("ran") for r in rows}
        return "ran" if True in verdicts else "raised" if verdicts == {False} else "not built"
    call = rec.get("image_call") or rec
    if call.get("ran") is True:
        return "ran"
    return "raised" if call.get("ran") is False else "not built"

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
image rows train: a type that ran stays among those TRL can train.

The tiny model: the type's config class with its defaults (transformers' own choice of an example checkpoint), every
width at every level of nesting shrunk by hpcmem.validate.shrink, the depth kept (layer-type lists and per-layer
tables stay consistent); a shrink the class's validation refuses is recorded as not built, not as TRL's verdict.
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
from hpcmem.validate.shrink import shrink_config
from hpcmem.validate.trl_run import deadline, quiet, run_trl

RECORDS = "vlm-trainable.jsonl"
SETTINGS = {"max_length": 32, "per_device_train_batch_size": 1}
TIMEOUT_S = 240


def tiny_config(model_type: str) -> dict[str, Any]:
    """The type's config class defaults, every width shrunk at every level of nesting (text_config, vision_config,
    an encoder-decoder's encoder and decoder and theirs)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    config = CONFIG_MAPPING[model_type]().to_dict()
    small = _shrink_nested(shrink_config(config, max_length=SETTINGS["max_length"]))
    _keep_equal_widths(config, small, _text_hidden(config), _text_hidden(small))
    _fit_rope_sections(small)
    return small


def _text_hidden(config: dict[str, Any]) -> int | None:
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    value = text.get("hidden_size")
    return value if isinstance(value, int) else None


def _keep_equal_widths(before: dict[str, Any], after: dict[str, Any], text_before: int | None,
                       text_after: int | None) -> None:
    """A width that equalled the text decoder's hidden size (a tower's output, an audio encoder's, a codebook) or its
    own config's hidden size still equals it, as the config classes' validators require; attention heads the shrink
    does not name (an audio encoder's `encoder_attention_heads`) go to 4, so the shrunk width divides."""
    own = next((k for k in ("hidden_size", "d_model", "embed_dim") if isinstance(before.get(k), int)), "hidden_size")
    own_before, own_after = before.get(own), after.get(own)
    for key, value in after.items():
        old = before.get(key)
        if isinstance(value, dict) and isinstance(old, dict):
            _keep_equal_widths(old, value, text_before, text_after)
        elif (not isinstance(key, str) or not isinstance(value, int) or isinstance(value, bool) or value != old
              or key == own):
            continue
        elif text_before and text_after and value == text_before and ("hidden" in key or "dim" in key):
            after[key] = text_after
        elif isinstance(own_before, int) and isinstance(own_after, int) and value == own_before and "dim" in key:
            after[key] = own_after
        elif key.endswith("attention_heads") and value > 4 and own_after != own_before:
            after[key] = 4


def _fit_rope_sections(config: dict[str, Any], head_dim: int | None = None) -> None:
    """Multimodal RoPE's `mrope_section` (time, height, width) sums to half the rotary head width; it is scaled to the
    shrunk one (the head width of the config that holds it: qk_rope_head_dim, head_dim, or hidden / heads)."""
    for key in ("qk_rope_head_dim", "head_dim"):
        if isinstance(config.get(key), int):
            head_dim = config[key]
            break
    else:
        if isinstance(config.get("hidden_size"), int) and isinstance(config.get("num_attention_heads"), int):
            head_dim = config["hidden_size"] // max(config["num_attention_heads"], 1)
    for key, value in config.items():
        if isinstance(value, dict):
            _fit_rope_sections(value, head_dim)
        elif key == "mrope_section" and isinstance(value, list) and head_dim and sum(value) != head_dim // 2:
            total, target = sum(value), head_dim // 2
            sections = [max(1, v * target // total) for v in value]
            sections[0] += target - sum(sections)
            config[key] = sections


def _shrink_nested(config: dict[str, Any]) -> dict[str, Any]:
    """shrink_config shrinks a config and the dicts it holds; the dicts those hold are shrunk here."""
    for value in config.values():
        if isinstance(value, dict):
            for key, inner in list(value.items()):
                if isinstance(inner, dict) and key != "per_layer_config":
                    value[key] = shrink_config(inner, max_length=SETTINGS["max_length"])
    return config


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
    with quiet(), deadline(TIMEOUT_S):
        try:
            verdict = run_trl(trainer, SETTINGS, config, steps=1, image_text=True)
        except TimeoutError:
            rec.update(built=None, ran=None, reason=f"timed out after {TIMEOUT_S} s")
            return _done(rec, start)
    built = not verdict.reason.startswith("shrunken model does not build")
    rec.update(built=built, ran=verdict.ran if built else None, reason=verdict.reason, raised_in=verdict.raised_in)
    return _done(rec, start)


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
    """"ran", "raised" or "not built" (the shrink's limit or a timeout: no verdict)."""
    if rec.get("ran") is True:
        return "ran"
    return "raised" if rec.get("ran") is False else "not built"

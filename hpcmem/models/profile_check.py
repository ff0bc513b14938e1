"""A learned profile checked before any of it is used: the shape `profile_from_dict` reads, every count an integer in
range, every coefficient a finite number of plausible size (a term may be negative: it can be relative to another).

A profile is JSON a user may place under ~/.config/hpcmem/profiles (or edit); a list where a mapping belongs, text
for a count, NaN, a short row or coefficients of −10¹² would otherwise surface as an internal error deep in the
estimate, or as a peak of a few MiB and a verdict of "fits". One line names the file, the place and the rule.
"""

from __future__ import annotations

import math
from typing import Any

from hpcmem.errors import SpecError

MAX_COUNT = 2**45            # parameters of a layer or a model, sizes (far above any model: 35 T)
MAX_LAYERS = 100_000
# |a| bytes, |b| bytes per token, |c| bytes per rows·seq², per layer: a layer that keeps 1 TB at no tokens, 100 MB
# per token (a 64k-wide layer saving fp32 tensors keeps ~10 MB) or 100 kB per query–key pair (128 fp32 heads: 512 B)
# is no model's; the largest learned (LongCat-Flash, 768 experts) has 1.3e11, 1.7e6 and 1,280
MAX_COEF = (1e12, 1e8, 1e5)
TERMS = ("fwd", "fpeak", "kept", "peak")
SINGLE = ("forward_entry", "forward_other", "head_other", "entry_other")


class ProfileError(SpecError):
    pass


def _fail(source: str, where: str, rule: str, value: Any) -> ProfileError:
    shown = repr(value)
    return ProfileError(f"learned profile {source}: {where} must be {rule}; got {shown[:60]}")


def _int(source: str, where: str, value: Any, lo: int = 0, hi: int = MAX_COUNT) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise _fail(source, where, f"an integer in {lo}..{hi}", value)
    return value


def _mapping(source: str, where: str, value: Any) -> dict:
    if not isinstance(value, dict):
        raise _fail(source, where, "a mapping", value)
    return value


def _list(source: str, where: str, value: Any, hi: int = MAX_LAYERS) -> list:
    if not isinstance(value, list) or len(value) > hi:
        raise _fail(source, where, f"a list of at most {hi} items", value)
    return value


def _poly(source: str, where: str, value: Any, depth: int = 0) -> list[list[float]]:
    """The [a, b, c] rows a term holds ({"max": [...]} is the highest of several)."""
    if isinstance(value, dict) and depth == 0:
        pieces = _list(source, f"{where}.max", value.get("max"), hi=4096)
        if not pieces:
            raise _fail(source, f"{where}.max", "a non-empty list", pieces)
        return [row for i, p in enumerate(pieces) for row in _poly(source, f"{where}.max[{i}]", p, 1)]
    if not isinstance(value, list) or len(value) != 3:
        raise _fail(source, where, "[a, b, c] (three numbers)", value)
    for x, bound, name in zip(value, MAX_COEF, "abc"):
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or abs(x) > bound:
            raise _fail(source, f"{where}.{name}", f"a finite number of magnitude ≤ {bound:.0e}", x)
    return [[float(x) for x in value]]


def check_profile_doc(doc: Any, source: str) -> None:
    """Raise ProfileError (one line) unless `doc` is a learned profile every reader of it can trust."""
    doc = _mapping(source, "the document", doc)
    for key in ("format", "model_type", "config_sha256"):
        if not isinstance(doc.get(key), str) or not 0 < len(doc[key]) <= 256:
            raise _fail(source, key, "text", doc.get(key))
    model = _mapping(source, "model", doc.get("model"))
    for key in ("hidden_size", "vocab_size"):
        _int(source, f"model.{key}", model.get(key), lo=1)
    _int(source, "model.max_position_embeddings", model.get("max_position_embeddings"))   # 0: no position limit
    for key in ("embed", "lm_head", "other"):
        _int(source, f"model.{key}", model.get(key))
    if not isinstance(model.get("tie_word_embeddings"), bool):
        raise _fail(source, "model.tie_word_embeddings", "true or false", model.get("tie_word_embeddings"))
    kinds = _list(source, "kinds", doc.get("kinds"), hi=1024)
    if not kinds:
        raise _fail(source, "kinds", "a non-empty list", kinds)
    for i, kind in enumerate(kinds):
        kind = _mapping(source, f"kinds[{i}]", kind)
        for key in ("params", "experts", "experts_active"):
            _int(source, f"kinds[{i}].{key}", kind.get(key))
        _int(source, f"kinds[{i}].idle", kind.get("idle", 0), hi=kind.get("params"))
        idle_linears = _list(source, f"kinds[{i}].idle_linears", kind.get("idle_linears", []), hi=4096)
        if not all(isinstance(x, str) for x in idle_linears):
            raise _fail(source, f"kinds[{i}].idle_linears", "linear names", idle_linears)
        for j, row in enumerate(_list(source, f"kinds[{i}].linears", kind.get("linears"), hi=4096)):
            where = f"kinds[{i}].linears[{j}]"
            if not isinstance(row, list) or not 6 <= len(row) <= 8 or not isinstance(row[0], str):
                raise _fail(source, where, "[name, in, out, count, nn_linear, bias(, held, runs)]", row)
            for k, name in ((1, "in"), (2, "out"), (3, "count")):
                _int(source, f"{where}.{name}", row[k], lo=1)
            if not all(isinstance(x, bool) for x in row[4:]):
                raise _fail(source, where, "booleans after the three counts", row[4:])
    for key in ("layer_kinds", "layer_map"):
        values = _list(source, key, doc.get(key))
        hi = len(kinds) - 1 if key == "layer_kinds" else MAX_LAYERS
        for i, x in enumerate(values):
            _int(source, f"{key}[{i}]", x, hi=hi)
    targets = doc.get("peft_default_targets")
    if targets is not None and not (isinstance(targets, list) and all(isinstance(t, str) for t in targets)):
        raise _fail(source, "peft_default_targets", "a list of module names or null", targets)
    cells = _mapping(source, "cells", doc.get("cells"))
    if not cells:
        raise _fail(source, "cells", "a non-empty mapping", cells)
    for key, cell in cells.items():
        cell = _mapping(source, f"cells.{key}", cell)
        for term in TERMS:
            for i, p in enumerate(_list(source, f"cells.{key}.{term}", cell.get(term))):
                _poly(source, f"cells.{key}.{term}[{i}]", p)
        for term in SINGLE:
            _poly(source, f"cells.{key}.{term}", cell.get(term))
        for i, p in enumerate(_list(source, f"cells.{key}.left", cell.get("left", []))):
            _poly(source, f"cells.{key}.left[{i}]", p)
    _mapping(source, "config", doc.get("config"))
    if "provenance" in doc:
        _mapping(source, "provenance", doc["provenance"])

"""The shape of a length profile that the estimator reads, checked when a profile is loaded (stdlib only).

A profile is a user's file: every part `tokens_per_micro_batch` reads is checked for its type here, so a file with
missing keys, wrong types or another schema ends in one ProfileError naming the part, never deep in the estimator.
"""

from __future__ import annotations

from collections.abc import Mapping

from hpcmem.data.batches import ROW_PARTS, TRAINERS
from hpcmem.data.errors import ProfileError
from hpcmem.inputs.values import InputError, choice, fail, integer, optional_integer, shown

SCHEMA = "hpcmem.lengths/1"
ENCODING = "zlib+base64 uint32le"
# Lengths one blob or the histogram may hold: the profiler stores per-example order up to 2,000,000 examples, and a
# packed-row blob has at most one row per sequence.
MAX_DECODED = 16_000_000


def check_profile(profile: Mapping) -> None:
    """The parts of a profile the estimator reads, with the right types: a ProfileError names the first that is not."""
    if not isinstance(profile, Mapping) or profile.get("schema") != SCHEMA:
        found = profile.get("schema") if isinstance(profile, Mapping) else type(profile).__name__
        raise ProfileError(f"not a length profile: schema is {shown(found)}, expected {SCHEMA!r} "
                           "(make one with `hpcmem lengths DATA --tokenizer PATH --save profile.json`)")
    try:
        _check_fields(profile)
    except InputError as exc:
        raise ProfileError(f"length profile: {exc.problems[0]}") from None


def _check_fields(profile: Mapping) -> None:
    source = profile.get("source")
    if not isinstance(source, Mapping):
        raise fail("source", source, "an object naming the trainer")
    trainer = choice("source.trainer", source.get("trainer"), TRAINERS)
    hist = profile.get("histogram")
    if not isinstance(hist, list) or len(hist) > MAX_DECODED:
        raise fail("histogram", hist, f"a list of at most {MAX_DECODED:,} [length, count] pairs")
    for i, pair in enumerate(hist):
        if not isinstance(pair, list) or len(pair) != 2:
            raise fail(f"histogram[{i}]", pair, "a [length, count] pair")
        integer(f"histogram[{i}] length", pair[0], lo=0, text_ok=False)
        integer(f"histogram[{i}] count", pair[1], lo=0, text_ok=False)
    order = profile.get("order")
    if order is not None:
        if not isinstance(order, Mapping) or not isinstance(order.get("parts"), Mapping):
            raise fail("order", order, "null or an object with encoding and parts")
        if order.get("encoding") != ENCODING:
            raise ProfileError(f"profile lengths use encoding {shown(order.get('encoding'))}; this hpcmem reads "
                               f"{ENCODING!r}")
        for name, blob in order["parts"].items():
            if name in ROW_PARTS[trainer] + ("prompt",) and not isinstance(blob, str):
                raise fail(f"order.parts.{name}", blob, "a length blob (text)")
        for name in ROW_PARTS[trainer]:
            if name not in order["parts"]:
                raise fail("order.parts", sorted(order["parts"]), f"a blob for each of {', '.join(ROW_PARTS[trainer])}"
                           f" ({trainer} profile)")
    _check_candidates(profile.get("candidates", []))


def _check_candidates(candidates: object) -> None:
    if not isinstance(candidates, list):
        raise fail("candidates", candidates, "a list")
    for i, cand in enumerate(candidates):
        if not isinstance(cand, Mapping) or not isinstance(cand.get("strategies"), Mapping):
            raise fail(f"candidates[{i}]", cand, "an object with max_length and strategies")
        optional_integer(f"candidates[{i}].max_length", cand.get("max_length"), lo=1, text_ok=False)
        strategies = cand["strategies"]
        for name, entry in strategies.items():
            target = strategies.get(entry.get("same_as")) if isinstance(entry, Mapping) else None
            ok = isinstance(entry, Mapping) and (
                isinstance(target, Mapping) and "same_as" not in target if "same_as" in entry
                else isinstance(entry.get("row_lengths", ""), str))
            if not ok:
                raise fail(f"candidates[{i}].strategies.{name}", entry, "an object with row_lengths or same_as")

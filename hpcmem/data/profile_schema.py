"""The shape of a length profile that the estimator reads, checked when a profile is loaded (stdlib only).

A profile is a user's file: every part `tokens_per_micro_batch` reads is checked for its type here, so a file with
missing keys, wrong types or another schema ends in one ProfileError naming the part, never deep in the estimator.
"""

from __future__ import annotations

from collections.abc import Mapping

from hpcmem.data.batches import ROW_PARTS, TRAINERS
from hpcmem.data.errors import ProfileError
from hpcmem.inputs.values import InputError, choice, fail, integer, optional_integer, shown

SCHEMA = "hpcmem.lengths/1"            # text-only data: unchanged since the first profiles
SCHEMA_VISION = "hpcmem.lengths/2"     # image-text data: /1 plus the `vision` section (hpcmem.data.profile)
SCHEMAS = (SCHEMA, SCHEMA_VISION)
VISION_PARTS = ("images", "image_tokens", "patches", "image_end")
ENCODING = "zlib+base64 uint32le"
# Lengths one blob or the histogram may hold: the profiler stores per-example order up to 2,000,000 examples, and a
# packed-row blob has at most one row per sequence.
MAX_DECODED = 16_000_000


def check_profile(profile: Mapping) -> None:
    """The parts of a profile the estimator reads, with the right types: a ProfileError names the first that is not."""
    if not isinstance(profile, Mapping) or profile.get("schema") not in SCHEMAS:
        found = profile.get("schema") if isinstance(profile, Mapping) else type(profile).__name__
        raise ProfileError(f"not a length profile: schema is {shown(found)}, expected {' or '.join(map(repr, SCHEMAS))}"
                           " (make one with `hpcmem lengths DATA --tokenizer PATH --save profile.json`)")
    try:
        _check_fields(profile)
        if profile["schema"] == SCHEMA_VISION:
            _check_vision(profile.get("vision"))
        elif "vision" in profile:
            raise fail("vision", "…", f"absent from a {SCHEMA} (text-only) profile")
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


def _check_vision(vision: object) -> None:
    """The image-text section of a /2 profile: the counts the estimator reads and the lengths in order (or null)."""
    if not isinstance(vision, Mapping):
        raise fail("vision", vision, f"an object (a {SCHEMA_VISION} profile holds image-text counts)")
    integer("vision.rows_per_example", vision.get("rows_per_example"), lo=1, hi=2, text_ok=False)
    stats = vision.get("stats")
    if not isinstance(stats, Mapping):
        raise fail("vision.stats", stats, "an object of stats per count")
    for name in VISION_PARTS + (("tiles",) if "tiles" in stats else ()):
        entry = stats.get(name)
        if not isinstance(entry, Mapping):
            raise fail(f"vision.stats.{name}", entry, "an object with count, p50, p90, p99, max")
        integer(f"vision.stats.{name}.max", entry.get("max"), lo=0, text_ok=False)
    order = vision.get("order")
    if order is not None:
        if not isinstance(order, Mapping) or not isinstance(order.get("parts"), Mapping):
            raise fail("vision.order", order, "null or an object with encoding and parts")
        if order.get("encoding") != ENCODING:
            raise fail("vision.order.encoding", order.get("encoding"), repr(ENCODING))
        for name in VISION_PARTS:
            if not isinstance(order["parts"].get(name), str):
                raise fail(f"vision.order.parts.{name}", order["parts"].get(name), "a length blob (text)")

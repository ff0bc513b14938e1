"""Typed checkers for one value where it enters hpcmem: each returns the value converted, or raises an InputError
whose one-line message names the field, shows the value and states the rule (stdlib only).

Conversions follow what the tool that finally reads the value accepts. TRL's `TrlParser` turns YAML values into
argparse defaults (trl/scripts/utils.py `set_defaults_with_config`), and argparse runs a string default through the
field's type, so `per_device_train_batch_size: "8"` is 8 and `use_peft: "yes"` is True
(transformers/hf_argparser.py `string_to_bool`); a float is never an integer there (`1.5` reaches the DataLoader).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Iterable

from hpcmem.errors import SpecError
from hpcmem.inputs.files import bounded_int, check_depth

# The largest count hpcmem accepts (batch sizes, lengths, processes, sizes in a config.json): int32's maximum. No real
# job comes near it; it keeps every product of a few counts far inside a float's range and every loop bounded.
MAX_COUNT = 2**31 - 1
MAX_TEXT = 4096                    # characters in one text value (a path, a name, a module list)
# transformers/hf_argparser.py string_to_bool: the words TRL accepts for a boolean field.
TRUE_WORDS = ("yes", "true", "t", "y", "1")
FALSE_WORDS = ("no", "false", "f", "n", "0")
_INT_TEXT = re.compile(r"[+-]?[0-9]{1,19}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# Invisible characters that change how text reads without changing what it is: bidirectional overrides and isolates
# (U+202A–202E, U+2066–2069: "Trojan Source"), zero-width spaces and joiners, the word joiner, the byte-order mark,
# the line and paragraph separators. A terminal or an editor showing a script or a path holding one misleads.
_INVISIBLE = re.compile("[\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u2069\ufeff]")
# lone surrogates: what Python makes of bytes that are not UTF-8 on the command line (os.fsdecode's surrogateescape)
_NOT_UTF8 = re.compile("[\ud800-\udfff]")


class InputError(SpecError):
    """One bad value at an input edge (a SpecError with one problem, so the CLI prints one line)."""


def shown(value: Any, limit: int = 60) -> str:
    """A value as the error shows it: repr (control characters escaped, so one line), cut to `limit` characters."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a value whose repr fails is still named by its type
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def fail(field: str, value: Any, rule: str) -> InputError:
    return InputError(f"{field} must be {rule}; got {shown(value)}")


def integer(field: str, value: Any, *, lo: int | None = None, hi: int = MAX_COUNT, text_ok: bool = True,
            or_none: bool = False) -> int:
    """An int (not a bool, not a float), or its decimal text when `text_ok`; within [lo, hi]."""
    rule = "an integer" + (f" in {lo}..{hi}" if lo is not None else f" ≤ {hi}") + (" or null" if or_none else "")
    if isinstance(value, str) and text_ok and _INT_TEXT.fullmatch(value.strip()):
        value = int(value.strip())
    if isinstance(value, float):
        rule += (" (NaN and infinity are not counts)" if not math.isfinite(value) else
                 " (written without a fraction or exponent)" if value.is_integer() else " (a fraction is not a count)")
    if isinstance(value, bool) or not isinstance(value, int):
        raise fail(field, value, rule)
    if (lo is not None and value < lo) or value > hi:
        raise fail(field, value, rule)
    return value


def row_lengths(field: str, value: str) -> tuple[int, ...]:
    """Comma-separated row lengths (tokens per row, each 1..MAX_COUNT), sorted, each once."""
    return tuple(sorted({integer(field, part, lo=1) for part in value.split(",")}))


def optional_integer(field: str, value: Any, **kw: Any) -> int | None:
    """`integer`, or None for null / "none" / "null" (`--max_length none`)."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "null")):
        return None
    return integer(field, value, or_none=True, **kw)


def number(field: str, value: Any, *, text_ok: bool = True) -> float:
    """A finite number (int or float, not a bool), or its text when `text_ok`: NaN and infinities are refused."""
    if isinstance(value, str) and text_ok and len(value) <= 64:
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise fail(field, value, "a number")
    if isinstance(value, int):
        if abs(value) > 2**53:
            raise fail(field, value, "a number of magnitude ≤ 2**53")
        return float(value)
    if not math.isfinite(value):
        raise fail(field, value, "a finite number")
    return value


def boolean(field: str, value: Any, *, text_ok: bool = True) -> bool:
    """A bool, or one of TRL's words for one (yes/no, true/false, t/f, y/n, 1/0, any case) when `text_ok`."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and text_ok:
        word = value.strip().lower()
        if word in TRUE_WORDS:
            return True
        if word in FALSE_WORDS:
            return False
    rule = "true or false" + (" (or the words yes/no, t/f, y/n, 1/0)" if text_ok else "")
    if isinstance(value, (int, float)):     # YAML's 1 is a number, not the word "1"
        rule += "; a number is not a boolean"
    raise fail(field, value, rule)


def text(field: str, value: Any, *, max_len: int = MAX_TEXT, numbers_ok: bool = False, controls: bool = False) -> str:
    """A string (or a number written as one when `numbers_ok`) of at most `max_len` characters; control characters
    (C0, DEL, C1: line breaks, tabs, NUL, escapes) only when `controls`."""
    if numbers_ok and isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise fail(field, value, "text")
    if len(value) > max_len:
        raise fail(field, value, f"text of at most {max_len} characters (this has {len(value)})")
    if not controls and _CONTROL.search(value):
        raise fail(field, value, "text without control characters (line breaks, tabs, NUL, escapes)")
    if _INVISIBLE.search(value):
        found = _INVISIBLE.search(value).group()
        raise fail(field, value, f"text without invisible characters (U+{ord(found):04X}: a bidirectional "
                                 "override, zero-width or separator character)")
    if _NOT_UTF8.search(value):
        raise fail(field, value, "text in UTF-8 (these bytes are not)")
    return value


def no_nul(field: str, value: str) -> str:
    """Text bound for a shell word: any character but NUL, which no argv and no bash string can hold."""
    if "\x00" in value:
        raise fail(field, value, "text without a NUL character")
    return value


def choice(field: str, value: Any, choices: Iterable[str]) -> str:
    options = tuple(choices)
    if not isinstance(value, str) or value not in options:
        raise fail(field, value, f"one of {', '.join(options)}")
    return value


def json_object(field: str, value: Any) -> dict:
    """A mapping with text keys, or its JSON text (TrainingArguments parses dict fields given as JSON strings)."""
    if isinstance(value, str):
        if len(value) > 65536:
            raise fail(field, value, "a JSON object of at most 64 KiB")
        try:
            value = json.loads(value, parse_int=bounded_int)
        except (ValueError, RecursionError) as exc:
            reason = (exc.msg if isinstance(exc, json.JSONDecodeError) else "nested too deeply"
                      if isinstance(exc, RecursionError) else str(exc))
            raise fail(field, value, f"a JSON object ({reason})") from None
        check_depth(value, field)
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise fail(field, value, "a mapping of names to values (e.g. {\"selective\": true})")
    return value


def text_list(field: str, value: Any, *, max_items: int = 1024) -> tuple[str, ...]:
    """One string, or a list of strings (each a name: no control characters)."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or len(items) > max_items:
        raise fail(field, value, f"a name or a list of at most {max_items} names")
    return tuple(text(f"{field}[{i}]", item, max_len=512) for i, item in enumerate(items))

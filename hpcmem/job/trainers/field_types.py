"""A value of a TRL field hpcmem does not model, checked as `trl <trainer>`'s parser checks it: TrlParser makes the
YAML's values the parser's defaults, and argparse parses a string default with the argument's type (int, float, or
transformers' string_to_bool for a boolean: hf_argparser.py) — so `seed: "abc"` stops `trl sft` before training. A
value of another Python type is handed on unparsed, as TRL does. The types are the installed parser's
(flag_kinds.json, rebuilt by tests/cli/test_trl_flags.py)."""

from __future__ import annotations

from typing import Any

from hpcmem.inputs.values import FALSE_WORDS, TRUE_WORDS, shown
from hpcmem.job.trainers.flags import kinds_of


def type_problem(trainer: str, name: str, value: Any) -> str | None:
    """Why TRL's parser refuses `value` for field `name`, or None when it takes it."""
    if not isinstance(value, str):
        return None
    kinds = kinds_of(trainer)
    if name in kinds["bool"]:
        if value.lower() in TRUE_WORDS + FALSE_WORDS:
            return None
        rule = "true or false (yes/no, t/f, y/n, 1/0)"
    elif name in kinds["int"] or name in kinds["float"]:
        kind = int if name in kinds["int"] else float
        try:
            kind(value)
            return None
        except ValueError:
            rule = "an integer" if kind is int else "a number"
    else:
        return None
    return f"{name} must be {rule} (trl {trainer}'s parser refuses anything else); got {shown(value)}"

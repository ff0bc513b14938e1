"""How `trl <trainer>`'s own argument parser reads each flag: a boolean takes an optional value (`--bf16` alone is
true), a list takes every word up to the next flag (`--lora_target_modules q_proj v_proj`), anything else one word;
`--no_<field>` sets a field whose default is true to false; `--some-field` is `--some_field`; a flag given twice keeps
the last (transformers/hf_argparser.py HfArgumentParser._parse_dataclass_field, argparse).

flag_kinds.json holds, per trainer, the boolean, list, int and float fields and the `--no_` flags of the script's parser
(trl/scripts/<trainer>.py make_parser); tests/cli/test_trl_flags.py rebuilds it from the installed TRL.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Literal

Kind = Literal["bool", "list", "value"]


@lru_cache(maxsize=1)
def _table() -> dict[str, dict]:
    return json.loads(Path(__file__).with_name("flag_kinds.json").read_text(encoding="utf-8"))


def kinds_of(trainer: str) -> dict:
    """flag_kinds.json's entry for `trainer`: its bool, list, int and float fields and its `--no_` flags."""
    return _table()[trainer]


def flag_kind(trainer: str, name: str) -> Kind:
    """How many words flag `--name` of `trl <trainer>` takes (`name` a declared field)."""
    kinds = _table()[trainer]
    return "bool" if name in kinds["bool"] else "list" if name in kinds["list"] else "value"


def negated(trainer: str, name: str) -> str | None:
    """The field `--name` sets to false (`no_gradient_checkpointing` → gradient_checkpointing), or None."""
    return _table()[trainer]["negated"].get(name)

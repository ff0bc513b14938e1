"""The keys an accelerate config file may hold: the fields of accelerate's ClusterConfig (accelerate 1.x,
commands/config/config_args.py), and the launch arguments its deepspeed_config / fsdp_config blocks may set
(commands/launch.py `launch_command_parser` groups), shipped as accelerate_keys.json so the light install knows them.

accelerate refuses a file with any other top-level key (BaseConfig.from_yaml_file: "had unknown keys"), so hpcmem
refuses it too, naming the nearest key — a misspelt `num_processes` would otherwise leave the job on one GPU.
tests/job/test_accelerate_keys.py holds the shipped list to the installed accelerate.
"""

from __future__ import annotations

import difflib
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from hpcmem.errors import Problems


@lru_cache(maxsize=1)
def accelerate_keys() -> tuple[str, ...]:
    text = Path(__file__).with_name("accelerate_keys.json").read_text(encoding="utf-8")
    return tuple(json.loads(text)["ClusterConfig"])


def block_keys(group: str) -> tuple[str, ...]:
    """The launch arguments of one group of accelerate's `launch_command_parser` ("DeepSpeed Arguments", "FSDP
    Arguments"): the keys a deepspeed_config / fsdp_config block of the file can set (hpcmem.job.accelerate_blocks)."""
    text = Path(__file__).with_name("accelerate_keys.json").read_text(encoding="utf-8")
    return tuple(json.loads(text)[group])


def check_accelerate_keys(raw: dict[str, Any], source: str) -> None:
    """Raise SpecError naming every top-level key of `raw` that accelerate's ClusterConfig does not declare."""
    p = Problems()
    known = accelerate_keys()
    for key in raw:
        if key in known:
            continue
        close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.75)
        hint = f"; did you mean {close[0]}?" if close else ""
        p.add(f"{source}: {key!r} is not an accelerate config key (accelerate launch refuses unknown keys){hint}")
    p.raise_if_any()

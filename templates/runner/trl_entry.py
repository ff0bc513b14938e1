"""Runs a TRL script with the image processor's resolution the memory estimate assumed.

hpcmem writes this file into a run folder, beside `processor.json`, when the job trains on images. TRL 1.16's
trainers build their processor as `AutoProcessor.from_pretrained(<model id>, revision=…, trust_remote_code=…)`
(trl/trainer/sft_trainer.py, dpo_trainer.py, grpo_trainer.py, rloo_trainer.py) and no TRL field reaches it, so the
checkpoint's preprocessor_config.json would decide how large every image becomes — not the bounds hpcmem estimated
with. This entry adds `processor.json`'s keywords (for the Qwen2-VL family: `size` = {"shortest_edge": min_pixels,
"longest_edge": max_pixels}, the names transformers 5's Qwen2VLImageProcessor reads) to every
`AutoProcessor.from_pretrained` call that does not set them itself, then runs the TRL script unchanged.

    accelerate launch … trl_entry.py trl.scripts.sft --config trl.yaml

It imports nothing from hpcmem: the compute node needs only TRL's own environment.
"""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path
from typing import Any

SETTINGS = Path(__file__).with_name("processor.json")


def install(extra: dict[str, Any]) -> None:
    """Make `AutoProcessor.from_pretrained` default to `extra`'s keywords (the caller's own keywords win)."""
    from transformers import AutoProcessor

    original = AutoProcessor.from_pretrained

    def from_pretrained(*args: Any, **kwargs: Any) -> Any:
        return original(*args, **{**extra, **kwargs})

    AutoProcessor.from_pretrained = staticmethod(from_pretrained)


def main(argv: list[str]) -> None:
    if len(argv) < 2 or not argv[1].replace(".", "").replace("_", "").isalnum():
        raise SystemExit(f"usage: {Path(argv[0]).name} <python module of the TRL script, e.g. trl.scripts.sft> "
                         "[its arguments]")
    install(json.loads(SETTINGS.read_text(encoding="utf-8")))
    module = argv[1]
    sys.argv = [module, *argv[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv)

"""The trainer registry: one frozen `TrainerEntry` per TRL trainer hpcmem knows (stdlib only).

    from hpcmem.job.trainers import entry, names
    entry("dpo").config_class        # "DPOConfig"
    entry("grpo").generates          # True

Adding a trainer is a module here holding its `ENTRY` (imported below, into REGISTRY), plus the files its hooks
name.
tests/launch/test_launch_parsers.py pins every entry's fields against the installed TRL dataclasses.
"""

from __future__ import annotations

from hpcmem.errors import SpecError
from hpcmem.job.trainers.common import MODEL_CONFIG_FIELDS
from hpcmem.job.trainers.distillation import ENTRY as DISTILLATION
from hpcmem.job.trainers.dpo import ENTRY as DPO
from hpcmem.job.trainers.entry import Hooks, TrainerEntry
from hpcmem.job.trainers.grpo import ENTRY as GRPO
from hpcmem.job.trainers.kto import ENTRY as KTO
from hpcmem.job.trainers.reward import ENTRY as REWARD
from hpcmem.job.trainers.rloo import ENTRY as RLOO
from hpcmem.job.trainers.sft import ENTRY as SFT

__all__ = ["MODEL_CONFIG_FIELDS", "Hooks", "TrainerEntry", "REGISTRY", "entry", "names", "owners"]

REGISTRY: dict[str, TrainerEntry] = {e.name: e for e in (SFT, DPO, REWARD, GRPO, RLOO, KTO, DISTILLATION)}


def names() -> tuple[str, ...]:
    """Every trainer, in hpcmem's order (the CLI's choices)."""
    return tuple(REGISTRY)


def entry(name: str) -> TrainerEntry:
    try:
        return REGISTRY[name]
    except KeyError:
        raise SpecError(f"unknown trainer {name!r}; choose one of {', '.join(REGISTRY)}") from None


def owners(field: str) -> tuple[str, ...]:
    """The trainers whose config class declares `field`, in hpcmem's order."""
    return tuple(e.name for e in REGISTRY.values() if e.declares(field))

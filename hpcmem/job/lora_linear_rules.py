"""peft's LoRA on an nn.Linear subclass whose forward is not nn.Linear's (hpcmem.models.lora_linear_subclasses):
get_peft_model wraps it and the first forward raises, so hpcmem refuses the targets that reach it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpcmem.models.lora_linear_subclasses import broken_leaves
from hpcmem.models.params import linear_modules
from hpcmem.models.peft_targets import ALL_LINEAR, model_targets, table

if TYPE_CHECKING:
    from hpcmem.job.protocol import Job


def linear_subclass_problems(job: Job) -> list[str]:
    """One line per adapted module whose LoRA forward raises (none where the targets are peft's defaults: peft's
    tables name no such module)."""
    t, m = job.train, job.model
    broken = broken_leaves(m.model_type)
    if not t.use_peft or not t.lora_target_modules or not broken:
        return []
    if len(t.lora_target_modules) == 1 and t.lora_target_modules[0] != ALL_LINEAR:
        return []     # one name is a regex over the whole path (hpcmem.job.rules says so): it reaches no leaf
    leaves = set(model_targets(m, tuple(t.lora_target_modules), tuple(t.lora_target_parameters)).modules)
    have = {mod.leaf: mod.name for mod in linear_modules(m) if mod.nn_linear}
    peft = f"peft {table()['versions']['peft']}"
    others = ",".join(sorted(set(have) - set(broken)))
    return [f"lora_target_modules {','.join(t.lora_target_modules)}: on model_type {m.model_type} {peft} wraps "
            f"{have[leaf]} ({cls}, an nn.Linear subclass) as lora.Linear, but {why}; "
            + (f"name the modules instead of all-linear, without {leaf} (e.g. {others})"
               if ALL_LINEAR in t.lora_target_modules else f"leave {leaf} out of lora_target_modules")
            for leaf, (cls, why) in sorted(broken.items()) if leaf in leaves and leaf in have]

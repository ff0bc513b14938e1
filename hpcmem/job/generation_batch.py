"""How many rows a generating trainer (GRPO, RLOO, distillation) generates, and pads, at once."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hpcmem.job.protocol import Job


def generation_batch_size(job: Job) -> int:
    """Rows generated per round across all ranks (grpo_config.py __post_init__; distillation_trainer.py
    `_get_train_sampler`: per_device_train_batch_size × processes × gradient_accumulation_steps)."""
    t = job.train
    world = job.parallel.world_size
    if t.generation_batch_size is not None:
        return t.generation_batch_size
    steps = t.steps_per_generation or t.gradient_accumulation_steps
    return t.per_device_train_batch_size * world * steps

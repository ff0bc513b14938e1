"""KTOTrainer's own refusals: the `rules` hook of its registry entry (hpcmem.job.trainers.kto)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hpcmem.errors import Problems
    from hpcmem.job.protocol import Job


def check(job: Job, p: Problems) -> None:
    """KTOTrainer.__init__ (kto_trainer.py): the KL term needs a second example in the micro-batch."""
    if job.train.per_device_train_batch_size <= 1:
        p.add("per_device_train_batch_size must be > 1 for KTO (KTOTrainer raises: with one row the KL term equals the "
              f"implied reward); got {job.train.per_device_train_batch_size}")
    if job.train.use_peft and "lm_head" in job.train.lora_target_modules:
        p.add("lora_target_modules lm_head: KTOTrainer reads lm_head.weight directly, so an adapter there would never "
              "train (KTOTrainer.__init__ raises) — remove lm_head")

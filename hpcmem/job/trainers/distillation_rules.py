"""DistillationTrainer's own refusals: the `rules` hook of its registry entry (hpcmem.job.trainers.distillation)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hpcmem.errors import Problems
    from hpcmem.job.protocol import Job


def check(job: Job, p: Problems) -> None:
    """trl/scripts/distillation.py, DistillationConfig.__post_init__ and DistillationTrainer.__init__."""
    t, teacher = job.train, job.teacher
    if not t.teacher_model_name_or_path or teacher is None:
        p.add("teacher_model_name_or_path is required for distillation (trl distillation raises without it): "
              "--teacher_model_name_or_path, a catalog id, config.json or folder")
    elif teacher.vocab_size != job.model.vocab_size:
        p.add(f"the teacher {teacher.name} has vocab_size {teacher.vocab_size} but the student {job.model.name} has "
              f"{job.model.vocab_size}: DistillationTrainer compares full next-token distributions and raises — use a "
              "teacher with the same vocabulary")
    if not 0.0 <= t.beta <= 1.0:
        p.add(f"beta must be in [0.0, 1.0] for distillation (DistillationConfig raises); got {t.beta}")
    if job.train.use_peft and "lm_head" in job.train.lora_target_modules:
        p.add("lora_target_modules lm_head: DistillationTrainer reads lm_head.weight directly, so an adapter there "
              "would never train (DistillationTrainer.__init__ raises) — remove lm_head")

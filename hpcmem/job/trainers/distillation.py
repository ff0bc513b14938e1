"""DistillationTrainer (trl/trainer/distillation_trainer.py): on-policy distillation. The student generates one
completion per prompt (B × gradient_accumulation_steps per round), then learns the teacher's next-token distribution
on them through a chunked generalized-JSD loss over both models' hidden states and LM heads; the teacher
(teacher_model_name_or_path) is held in memory, frozen, and runs a no-grad forward per micro-batch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpcmem.job.trainers.common import COMMON
from hpcmem.job.trainers.entry import Hooks, TrainerEntry

if TYPE_CHECKING:
    from hpcmem.errors import Problems
    from hpcmem.job.jobspec import JobSpec

ENTRY = TrainerEntry(
    name="distillation", config_class="DistillationConfig", trainer_class="DistillationTrainer",
    fields=COMMON + ("max_completion_length", "beta", "disable_dropout", "use_vllm", "vllm_mode",
                     "vllm_gpu_memory_utilization", "vllm_tensor_parallel_size", "vllm_enable_sleep_mode",
                     "ds3_gather_for_generation", "teacher_model_name_or_path", "teacher_model_init_kwargs"),
    defaults={"beta": 1.0},
    generates=True, autocast=False,
    hooks=Hooks(rules="hpcmem.job.trainers.distillation:check", estimate="hpcmem.estimate.distillation:extras",
                loss="hpcmem.estimate.distillation:loss", trace_design="hpcmem.trace.distillation:design",
                trace_build="hpcmem.trace.distillation:build",
                trace_check="hpcmem.trace.distillation:check_traceable",
                trace_notes="hpcmem.trace.distillation:notes",
                probe_dataset="hpcmem.trace.distillation:probe_dataset",
                probe_kwargs="hpcmem.trace.distillation:probe_kwargs"),
)


def check(job: JobSpec, p: Problems) -> None:
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

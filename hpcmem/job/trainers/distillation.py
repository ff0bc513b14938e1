"""DistillationTrainer (trl/trainer/distillation_trainer.py): on-policy distillation. The student generates one
completion per prompt (B × gradient_accumulation_steps per round), then learns the teacher's next-token distribution
on them through a chunked generalized-JSD loss over both models' hidden states and LM heads; the teacher
(teacher_model_name_or_path) is held in memory, frozen, and runs a no-grad forward per micro-batch."""

from __future__ import annotations

from hpcmem.job.trainers.common import COMMON
from hpcmem.job.trainers.entry import Hooks, Lengths, TrainerEntry

ENTRY = TrainerEntry(
    name="distillation", config_class="DistillationConfig", trainer_class="DistillationTrainer",
    fields=COMMON + ("max_completion_length", "beta", "disable_dropout", "use_vllm", "vllm_mode",
                     "vllm_gpu_memory_utilization", "vllm_tensor_parallel_size", "vllm_enable_sleep_mode",
                     "ds3_gather_for_generation", "teacher_model_name_or_path", "teacher_model_init_kwargs"),
    defaults={"beta": 1.0},
    generates=True, autocast=False,
    lengths=Lengths(unprofiled=("DistillationTrainer trains on completions the student generates",
                                 "--max_prompt_length and --max_completion_length")),
    hooks=Hooks(rules="hpcmem.job.trainers.distillation_rules:check", estimate="hpcmem.estimate.distillation:extras",
                loss="hpcmem.estimate.distillation:loss", trace_design="hpcmem.trace.distillation:design",
                trace_build="hpcmem.trace.distillation:build",
                trace_check="hpcmem.trace.distillation:check_traceable",
                trace_notes="hpcmem.trace.distillation:notes",
                probe_dataset="hpcmem.trace.distillation:probe_dataset",
                probe_kwargs="hpcmem.trace.distillation:probe_kwargs"),
)

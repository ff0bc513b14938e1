"""GRPOTrainer (trl/trainer/grpo_trainer.py): generates, scores, and trains on prompt + completion rows."""

from hpcmem.trainers.common import COMMON, GENERATION
from hpcmem.trainers.entry import Hooks, TrainerEntry

ENTRY = TrainerEntry(
    name="grpo", config_class="GRPOConfig", trainer_class="GRPOTrainer",
    fields=COMMON + GENERATION + ("vllm_importance_sampling_correction", "cast_lm_head_to_fp32", "disable_dropout"),
    defaults={"beta": 0.0, "num_generations": 8},
    generates=True, reference="when_beta", old_logps="when_misaligned",
    hooks=Hooks(rules="hpcmem.rules:check_generation", trace_design="hpcmem.trace.rl:design_rl",
                trace_build="hpcmem.trace.rl:build_rl", trace_check="hpcmem.trace.rl:check_rl",
                trace_notes="hpcmem.trace.rl:rl_notes", probe_dataset="hpcmem.probe.fixtures:prompt_dataset",
                probe_kwargs="hpcmem.probe.fixtures:reward_kwargs"),
)

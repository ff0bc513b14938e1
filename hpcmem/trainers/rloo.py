"""RLOOTrainer (trl/trainer/rloo_trainer.py): GRPO's generation round, with the old log-prob pass in every round."""

from hpcmem.trainers.common import COMMON, GENERATION
from hpcmem.trainers.entry import Hooks, TrainerEntry

ENTRY = TrainerEntry(
    name="rloo", config_class="RLOOConfig", trainer_class="RLOOTrainer",
    fields=COMMON + GENERATION + ("disable_dropout",),
    defaults={"beta": 0.05, "num_generations": 2},
    generates=True, reference="when_beta", old_logps="always",
    hooks=Hooks(rules="hpcmem.rules:check_generation", trace_design="hpcmem.trace.rl:design_rl",
                trace_build="hpcmem.trace.rl:build_rl", trace_check="hpcmem.trace.rl:check_rl",
                trace_notes="hpcmem.trace.rl:rl_notes", probe_dataset="hpcmem.probe.fixtures:prompt_dataset",
                probe_kwargs="hpcmem.probe.fixtures:reward_kwargs"),
)

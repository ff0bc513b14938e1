"""RLOOTrainer (trl/trainer/rloo_trainer.py): GRPO's generation round, with the old log-prob pass in every round."""

from hpcmem.job.trainers.common import COMMON, GENERATION, RL_HOOKS
from hpcmem.job.trainers.entry import Lengths, TrainerEntry

ENTRY = TrainerEntry(
    name="rloo", config_class="RLOOConfig", trainer_class="RLOOTrainer",
    script_class="RLOOScriptArguments",
    fields=COMMON + GENERATION + ("disable_dropout", "router_aux_loss_coef"),
    defaults={"beta": 0.05, "num_generations": 2},
    generates=True, reference="when_beta", old_logps="always",
    lengths=Lengths(dataset="prompt_only", row_parts=("prompt",), truncates=False, profile_as="grpo"),
    hooks=RL_HOOKS,
)

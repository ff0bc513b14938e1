"""GRPOTrainer (trl/trainer/grpo_trainer.py): generates, scores, and trains on prompt + completion rows."""

from hpcmem.job.trainers.common import COMMON, GENERATION, RL_HOOKS
from hpcmem.job.trainers.entry import Lengths, TrainerEntry

ENTRY = TrainerEntry(
    name="grpo", config_class="GRPOConfig", trainer_class="GRPOTrainer",
    script_class="GRPOScriptArguments",
    fields=COMMON + GENERATION + ("vllm_importance_sampling_correction", "cast_lm_head_to_fp32", "disable_dropout",
                                  "router_aux_loss_coef"),
    defaults={"beta": 0.0, "num_generations": 8},
    generates=True, reference="when_beta", old_logps="when_misaligned",
    lengths=Lengths(dataset="prompt_only", row_parts=("prompt",), truncates=False),
    hooks=RL_HOOKS,
)

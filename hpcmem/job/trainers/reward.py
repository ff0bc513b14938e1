"""RewardTrainer (trl/trainer/reward_trainer.py): chosen + rejected through a sequence-classification (score) head."""

from hpcmem.job.trainers.common import COMMON
from hpcmem.job.trainers.entry import Hooks, Lengths, TrainerEntry

ENTRY = TrainerEntry(
    name="reward", config_class="RewardConfig", trainer_class="RewardTrainer",
    fields=COMMON + ("max_length", "activation_offloading", "disable_dropout"),
    defaults={"disable_dropout": True},
    rows_per_example=2, head="score",
    lengths=Lengths(dataset="preference", measures_prompt=False, row_parts=("chosen", "rejected"),
                    drops_overlong=True),
    hooks=Hooks(trace_design="hpcmem.trace.data:design_preference", trace_build="hpcmem.trace.pref:build_reward",
                trace_check="hpcmem.trace.pref:check_preference", trace_notes="hpcmem.trace.pref:reward_notes",
                probe_dataset="hpcmem.probe.fixtures:reward_dataset"),
)

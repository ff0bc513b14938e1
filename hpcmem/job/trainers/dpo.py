"""DPOTrainer (trl/trainer/dpo_trainer.py): chosen + rejected in one forward; a reference model unless precomputed."""

from hpcmem.job.trainers.common import COMMON
from hpcmem.job.trainers.entry import Hooks, Lengths, TrainerEntry

ENTRY = TrainerEntry(
    name="dpo", config_class="DPOConfig", trainer_class="DPOTrainer",
    fields=COMMON + ("max_length", "padding_free", "activation_offloading", "precompute_ref_log_probs", "beta",
                     "disable_dropout", "router_aux_loss_coef"),
    defaults={"beta": 0.1, "disable_dropout": True},
    rows_per_example=2, reference="unless_precomputed",
    lengths=Lengths(dataset="preference", row_parts=("chosen", "rejected"), drops_long_prompt=True),
    hooks=Hooks(trace_design="hpcmem.trace.data:design_preference", trace_build="hpcmem.trace.pref:build_dpo",
                trace_check="hpcmem.trace.pref:check_preference", trace_notes="hpcmem.trace.pref:dpo_notes",
                probe_dataset="hpcmem.probe.fixtures:dpo_dataset"),
)

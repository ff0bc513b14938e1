"""KTOTrainer (trl/trainer/kto_trainer.py): unpaired examples (a prompt, one completion, a desirable/undesirable
label), B rows per micro-batch, plus — for the KL term — the same prompts with the batch's completions rotated by one,
run through the policy without gradients before the forward and through the reference model after it (a second
model unless PEFT or precompute_ref_log_probs, as for DPO)."""

from __future__ import annotations

from hpcmem.job.trainers.common import COMMON
from hpcmem.job.trainers.entry import Hooks, Lengths, TrainerEntry

ENTRY = TrainerEntry(
    name="kto", config_class="KTOConfig", trainer_class="KTOTrainer",
    fields=COMMON + ("max_length", "activation_offloading", "precompute_ref_log_probs", "beta", "disable_dropout",
                       "router_aux_loss_coef"),
    defaults={"beta": 0.1, "disable_dropout": True},
    reference="unless_precomputed",
    lengths=Lengths(dataset="unpaired_preference", row_parts=("length",), drops_long_prompt=True, kl_rows=True),
    hooks=Hooks(rules="hpcmem.job.trainers.kto_rules:check", trace_design="hpcmem.trace.kto:design",
                trace_build="hpcmem.trace.kto:build", trace_check="hpcmem.trace.kto:check_traceable",
                trace_notes="hpcmem.trace.kto:notes", probe_dataset="hpcmem.trace.kto:probe_dataset"),
)

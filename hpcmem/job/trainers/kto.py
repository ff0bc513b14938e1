"""KTOTrainer (trl/trainer/kto_trainer.py): unpaired examples (a prompt, one completion, a desirable/undesirable
label), B rows per micro-batch, plus — for the KL term — the same prompts with the batch's completions rotated by one,
run through the policy without gradients before the forward and through the reference model after it (a second
model unless PEFT or precompute_ref_log_probs, as for DPO)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpcmem.job.trainers.common import COMMON
from hpcmem.job.trainers.entry import Hooks, TrainerEntry

if TYPE_CHECKING:
    from hpcmem.errors import Problems
    from hpcmem.job.jobspec import JobSpec

ENTRY = TrainerEntry(
    name="kto", config_class="KTOConfig", trainer_class="KTOTrainer",
    fields=COMMON + ("max_length", "activation_offloading", "precompute_ref_log_probs", "beta", "disable_dropout",
                       "router_aux_loss_coef"),
    defaults={"beta": 0.1, "disable_dropout": True},
    reference="unless_precomputed",
    hooks=Hooks(rules="hpcmem.job.trainers.kto:check", trace_design="hpcmem.trace.kto:design",
                trace_build="hpcmem.trace.kto:build", trace_check="hpcmem.trace.kto:check_traceable",
                trace_notes="hpcmem.trace.kto:notes", probe_dataset="hpcmem.trace.kto:probe_dataset"),
)


def check(job: JobSpec, p: Problems) -> None:
    """KTOTrainer.__init__ (kto_trainer.py): the KL term needs a second example in the micro-batch."""
    if job.train.per_device_train_batch_size <= 1:
        p.add("per_device_train_batch_size must be > 1 for KTO (KTOTrainer raises: with one row the KL term equals the "
              f"implied reward); got {job.train.per_device_train_batch_size}")
    if job.train.use_peft and "lm_head" in job.train.lora_target_modules:
        p.add("lora_target_modules lm_head: KTOTrainer reads lm_head.weight directly, so an adapter there would never "
              "train (KTOTrainer.__init__ raises) — remove lm_head")

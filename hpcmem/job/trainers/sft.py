"""SFTTrainer (trl/trainer/sft_trainer.py): one row per example; packing and padding-free change the batch."""

from hpcmem.job.trainers.common import COMMON
from hpcmem.job.trainers.entry import Hooks, Lengths, TrainerEntry

ENTRY = TrainerEntry(
    name="sft", config_class="SFTConfig", trainer_class="SFTTrainer",
    fields=COMMON + ("max_length", "packing", "packing_strategy", "padding_free", "activation_offloading",
                       "router_aux_loss_coef"),
    packs=True,
    lengths=Lengths(dataset="language_modeling", row_parts=("length",), drops_long_prompt=True),
    hooks=Hooks(rules="hpcmem.job.rules:check_sft", trace_design="hpcmem.trace.data:design_sft",
                trace_build="hpcmem.trace.trainer:build_sft", probe_dataset="hpcmem.probe.fixtures:design_dataset"),
)

"""Values the estimate assumes rather than reads, each said beside the figure it moves with the flag that sets it.

- max_prompt_length (GRPO, RLOO, distillation with generation): TRL 1.16's GRPOConfig and RLOOConfig have no such
  field — the prompt's length is the dataset's — so hpcmem takes its own field's value (512 unless set) as the
  longest prompt of a batch.
- row lengths (every other trainer): without a length profile every row is taken max_length tokens long (TRL's
  collators pad each batch to its longest row: the worst case) — and, for DPO and KTO, every position of it scored
  (TRL labels the prompt -100; a profile counts the completions: JobSpec `label_tokens_per_micro_batch`).
"""

from __future__ import annotations

from typing import Any

from hpcmem.job.jobspec import JobSpec
from hpcmem.job.position_table import model_positions
from hpcmem.job.trainers import entry


def assumed_names(trainer: str, settings: dict[str, Any], tokens_per_micro_batch: int | None) -> tuple[str, ...]:
    """Which assumptions a job built from `settings` rests on (names as `describe` knows them)."""
    if entry(trainer).generates:
        return () if "max_prompt_length" in settings else ("max_prompt_length",)
    return () if tokens_per_micro_batch is not None else ("row_lengths",)


def describe(job: JobSpec) -> list[dict[str, Any]]:
    """One entry per assumption: the field, the value taken, why it is assumed and what sets it."""
    out = []
    for name in job.assumed:
        if name == "max_prompt_length":
            out.append({"field": "max_prompt_length", "value": job.train.max_prompt_length,
                        "why": f"{entry(job.train.trainer).config_class} has no max_prompt_length: the longest "
                               "prompt is the dataset's, not a setting",
                        "set_with": "--max_prompt_length N, or --lengths PROFILE (hpcmem lengths --save)"})
        elif name == "row_lengths":
            value = job.train.max_length if job.train.max_length is not None else model_positions(job.model)[1]
            out.append({"field": "row lengths", "value": value,
                        "why": "no length profile: every row is taken this long (TRL pads a batch to its longest "
                               "row)" + (", every position of it scored (TRL scores the completions only)"
                                         if job.train.trainer in ("dpo", "kto") else ""),
                        "set_with": "--lengths PROFILE (hpcmem lengths --save)"})
    return out

"""What the oracles' traces put in a job's rows that its settings do not say, told to the estimate as a length profile
of that data would tell it: the random jobs (hpcmem.validate.random_trace) and the trace matrix (hpcmem.validate.trace)
score the estimate of the job the trace ran, data included."""

from __future__ import annotations

import dataclasses

from hpcmem.job.jobspec import JobSpec
from hpcmem.trace import kto as trace_kto
from hpcmem.trace.data import preference_label_tokens


def scored_as_traced(spec: JobSpec) -> JobSpec:
    """The job with the label count of the text rows the trace builds for it (JobSpec `label_tokens_per_micro_batch`):
    DPO's and KTO's rows are half prompt, which TRL does not score (hpcmem.trace.data `preference_label_tokens`,
    hpcmem.trace.kto `label_tokens`). Image rows (their prompts hold the images: the estimate counts those itself,
    hpcmem.job.image_rules) and other trainers are left as they are."""
    counted = {"dpo": preference_label_tokens, "kto": trace_kto.label_tokens}.get(spec.train.trainer)
    if counted is None or spec.train.has_images:
        return spec
    return dataclasses.replace(spec, label_tokens_per_micro_batch=counted(spec))

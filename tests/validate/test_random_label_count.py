"""The random oracle gives the estimate of a DPO or KTO job the scored-token count of the rows the trace builds:
half of each row is prompt (hpcmem/trace/data.py `preference_prompt_length`, hpcmem/trace/kto.py `prompt_length`),
which TRL labels -100, and TRL's fused LM head gathers the scored positions only — as a length profile of that data
would tell the estimate (JobSpec `label_tokens_per_micro_batch`). Without it the estimate takes every position as
scored (the bound), which on a small model's head reads as an over-estimate of the whole step.

Known answers: the traces of random jobs s1-650 (falcon_mamba, learned; DPO full fine-tuning with checkpointing, 2 × 302
tokens, chosen + rejected) and s2-117 (opt, learned; KTO full fine-tuning with checkpointing, 6 × 752 tokens), whose
peaks are the fused LM head's backward (their jobs stored in tests/fixtures/random/)."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from tests.helpers.trace_helpers import (  # noqa: E402
    assert_within,
    estimated_peak,
    stored_random_job,
    traced_and_estimated,
)

pytestmark = pytest.mark.torch


@pytest.mark.parametrize("fixture,trainer", [("s1-650-falcon-mamba-dpo-label-count.json", "dpo"),
                                             ("s2-117-opt-kto-label-count.json", "kto")])
def test_a_preference_job_with_the_traces_label_count_is_within_1_pct(fixture, trainer):
    from dataclasses import replace

    from hpcmem.validate.oracle_data import scored_as_traced

    spec = stored_random_job(fixture)
    assert spec.train.trainer == trainer and spec.label_tokens_per_micro_batch is None
    traced, _, every_position = traced_and_estimated(spec)
    assert "lm head" in traced.phase, traced.phase
    counted = scored_as_traced(spec)
    t = spec.train
    # half of each row is prompt: B rows (KTO) or 2·B rows (DPO) of max_length − max_length // 2 scored tokens
    rows = t.per_device_train_batch_size * (2 if trainer == "dpo" else 1)
    assert counted.label_tokens_per_micro_batch == rows * (t.max_length - t.max_length // 2)
    _, peak = estimated_peak(counted)
    assert_within(peak, traced.peak_allocated_bytes, 0.01)
    # every position scored: the bound, above the trace by more than 3 % on these small heads
    assert every_position > 1.03 * traced.peak_allocated_bytes
    assert replace(counted, label_tokens_per_micro_batch=None) == spec

"""Reward on a learned type: a learned profile's cells are traced on SFT jobs, whose terms hold TRL's fused LM head
(hpcmem.trace.learn `learn_job`); a reward model has a one-output score head instead. The estimate takes the traced
SFT head out of the terms whatever the job's trainer is (hpcmem.estimate.learned `traced_head`) and adds the job's
own head.

Known answer: the trace of random job s2-46 (OLMo reward, full fine-tune with checkpointing, 6 × 268 tokens; its job
stored as tests/fixtures/random/), which the estimate read 11.9 % over while it took the score head's bytes out of
the terms instead of the SFT head's (the vocabulary's logits tiles stayed in)."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from tests.helpers.trace_helpers import assert_within, stored_random_job, traced_and_estimated  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.mark.slow
def test_a_learned_reward_job_carries_its_score_head_not_the_traced_lm_head():
    spec = stored_random_job("s2-46-olmo-reward.json")
    assert spec.model.learned is not None and spec.train.trainer == "reward"
    traced, _, peak = traced_and_estimated(spec)
    assert_within(peak, traced.peak_allocated_bytes, 0.03)

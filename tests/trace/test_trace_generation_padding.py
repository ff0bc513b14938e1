"""The generating trainers' traced completions pad every micro-batch.

GRPO, RLOO and DistillationTrainer shuffle the generation batch before they split it into micro-batches
(`_prepare_inputs`: shuffle_sequence_dict, then split_tensor_dict), and real completions end at many lengths, so every
micro-batch carries padding and its 4-D attention mask. The trace once made only the last completion shorter: under
gradient accumulation only the micro-batch that drew it was masked, and the trace's peak could fall in an unmasked
one — a batch no real run makes. Known answer: random job s2-81 (Qwen2 distillation, fp32 weights, 3 × (2,243 +
278) tokens, 2 micro-batches; its job stored in tests/fixtures/random/), which the estimate (every micro-batch
masked) read +7.9 % over the old trace: the trace's peak micro-batch held neither the [3, 1, S, S] mask nor the
repeated k/v heads SDPA gets without GQA."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from tests.helpers.trace_helpers import assert_within, stored_random_job, traced_and_estimated  # noqa: E402

pytestmark = pytest.mark.torch


def test_all_completions_but_the_first_are_one_token_shorter():
    from hpcmem.trace.rl import traced_completions

    got = traced_completions(4, 5, 7)
    assert [len(c) for c in got] == [5, 4, 4, 4] and {t for c in got for t in c} == {7}
    assert traced_completions(1, 5, 7) == [[7] * 5]


@pytest.mark.slow
def test_an_accumulating_distillation_job_is_within_3_pct_of_its_trace():
    spec = stored_random_job("s2-81-qwen2-distillation-accumulation.json")
    assert spec.train.gradient_accumulation_steps == 2 and spec.train.trainer == "distillation"
    traced, _, peak = traced_and_estimated(spec)
    assert_within(peak, traced.peak_allocated_bytes, 0.03)

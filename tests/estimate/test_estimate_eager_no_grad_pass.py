"""A no-grad pass whose attention runs eager (Gemma 2's logit soft-capping: transformers runs eager whatever is
asked) builds its [rows, heads, seq, seq] scores on top of everything the trained model saved: at its softmax the
masked 16-bit scores, the fp32 copy softmax makes of them and the fp32 output (hpcmem.estimate.activations
`eager_scores_no_grad`, read by hpcmem.estimate.distillation `teacher_pass` and by DPO's / KTO's reference pass,
hpcmem.estimate.trainers `reference_pass`).

Known answer: the trace of random job s2-153 (Gemma 2 distillation, DoRA on all linears without checkpointing,
8 × (2,140 + 633) tokens, 3 micro-batches; its job stored in tests/fixtures/random/), whose peak is the teacher's
softmax in layer 1 ("step 2 / forward / layer 1": five fp32 score tensors alive, three the student saved and two of
the teacher's); the estimate read −5.0 % without the teacher's scores, +4.2 % with them while the end of its forward
still carried DoRA's per-linear instant (tests/estimate/test_estimate_dora_forward_instant.py). And the same
model under DPO (LoRA on all linears without checkpointing, 2 × 4,096 tokens: s2-153's job with DPO's settings), whose
peak is the reference forward's layer 1: −13.5 % without the reference's scores."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from tests.helpers.trace_helpers import assert_within, stored_random_job, traced_and_estimated  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.mark.slow
def test_an_eager_teacher_s_pass_is_within_3_pct_of_its_trace():
    spec = stored_random_job("s2-153-gemma2-dora-distillation-eager-teacher.json")
    assert spec.model.attn_logit_softcapping and not spec.train.gradient_checkpointing
    traced, est, peak = traced_and_estimated(spec)
    assert "forward / layer" in traced.phase, traced.phase
    assert_within(peak, traced.peak_allocated_bytes, 0.03)


@pytest.mark.slow
def test_an_eager_reference_pass_is_within_3_pct_of_its_trace():
    spec = stored_random_job("gemma2-dpo-lora-eager-reference.json")
    assert spec.train.trainer == "dpo" and spec.train.use_peft and not spec.train.gradient_checkpointing
    traced, est, peak = traced_and_estimated(spec)
    assert "reference forward / layer" in traced.phase, traced.phase
    assert_within(peak, traced.peak_allocated_bytes, 0.03)


def test_the_eager_scores_by_hand():
    """Three [rows, heads, seq, seq] tensors at the softmax (bf16 scores, fp32 copy, fp32 output), k and v repeated
    to every head, the causal and the sliding eager masks — a hand count for one small shape."""
    from hpcmem.estimate.activations import eager_scores_no_grad
    from hpcmem.models.spec import ModelSpec

    spec = stored_random_job("s2-153-gemma2-dora-distillation-eager-teacher.json")
    m: ModelSpec = spec.model
    rows, seq, heads, hd = 2, 100, m.num_attention_heads, m.head_dim     # 16 heads of 256, 8 kv heads
    by_hand = heads * rows * seq * seq * (2 + 4 + 4) + 2 * rows * seq * heads * hd * 2 + 2 * 2 * rows * seq * seq
    assert eager_scores_no_grad(m, rows, seq, 2, "sdpa") == by_hand
    assert eager_scores_no_grad(m, rows, seq, 4, "sdpa") == (heads * rows * seq * seq * 8
                                                             + 2 * rows * seq * heads * hd * 4
                                                             + 2 * 4 * rows * seq * seq)

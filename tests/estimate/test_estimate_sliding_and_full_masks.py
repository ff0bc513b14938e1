"""Padded rows of a model with full and sliding attention layers get two 4-D masks per forward, one per kind
(modeling_gemma3.py `causal_mask_mapping`: masking_utils `create_causal_mask` and `create_sliding_window_causal_mask`),
both materialized for SDPA and both kept for the recompute under checkpointing (hpcmem.estimate.activations
`mask_bytes`).

Known answer: the trace of random job s5-85 (Gemma 3 1B KTO, LoRA, fp32 weights under bf16 autocast, checkpointing,
7 × 21,758 padded tokens, 6 layers; its job stored in tests/fixtures/random/), whose peak — the last layer's backward —
holds two [7, 1, 21758, 21758] boolean masks (3,160 MiB each); the estimate read −5.2 % with one."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from tests.helpers.trace_helpers import assert_within, stored_random_job, traced_and_estimated  # noqa: E402

pytestmark = pytest.mark.torch


def test_two_masks_by_hand():
    from hpcmem.estimate.activations import mask_bytes
    from hpcmem.job.shape import micro_batch

    spec = stored_random_job("s5-85-gemma3-kto-two-masks.json")
    m = spec.model
    assert 0 < len(m.sliding_layers) < m.num_hidden_layers
    mb = micro_batch(spec)
    assert mb.masked
    assert mask_bytes(mb, m, "sdpa") == 2 * mb.rows * mb.seq * mb.seq
    assert mask_bytes(mb, m, "eager") == mb.rows * mb.seq * mb.seq       # eager: one mask, as traced on Gemma 2


@pytest.mark.slow
def test_a_model_with_both_kinds_of_layer_is_within_3_pct_of_its_trace():
    spec = stored_random_job("s5-85-gemma3-kto-two-masks.json")
    traced, _, peak = traced_and_estimated(spec)
    assert_within(peak, traced.peak_allocated_bytes, 0.03)

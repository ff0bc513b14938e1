"""A learned type with a tied LM head, full fine-tuning under gradient accumulation: the head's new [V, H] gradient
waits in autograd's input buffer for the embedding's through every layer's backward, beside the accumulated `.grad`
(hpcmem.estimate.closing `tied_head_gradient`). The learned cells are traced without accumulation, where that
gradient is the head's `.grad`; the layers' backward phase now carries it as the derived one does.

Known answer: the trace of random job s2-85 (SmolLM3 SFT, full + GC, 5 × 5,597 tokens, 4 micro-batches, tied
embeddings; its job stored in tests/fixtures/random/), which the estimate read −4.5 % without it."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from tests.helpers.trace_helpers import assert_within, stored_random_job, traced_and_estimated  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.mark.slow
def test_a_learned_tied_head_job_under_accumulation_is_within_3_pct_of_its_trace():
    spec = stored_random_job("s2-85-smollm3-tied-accumulation.json")
    assert spec.model.learned is not None and spec.model.tie_word_embeddings
    assert spec.train.gradient_accumulation_steps > 1 and not spec.train.use_peft
    traced, est, peak = traced_and_estimated(spec)
    assert_within(peak, traced.peak_allocated_bytes, 0.03)
    assert any(c.name == "tied head gradient" for p in est.phases if p.name.startswith("backward (layer")
               for c in p.components)

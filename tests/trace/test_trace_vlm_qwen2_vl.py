"""Qwen2-VL traced now against its estimate: TRL's SFTTrainer with its vision collator and transformers' processor on
a real 448×448 image, the published 7B widths cut to 1 decoder layer and 4 vision blocks (estimator/cases/
vlm-qwen2-vl.yaml): full fine-tuning at 448 px without checkpointing (every block's saved tensors alive), LoRA on every
linear at 896 px with checkpointing (a recomputed block and its adapters' gradients). Both the step's peak and the
tower's own backward (its blocks from the last down to block 1; block 0's phase also holds the token embedding's
gradient, which the estimate places in "backward (embeddings)") within 3 %. About 20 s on two shared cores."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from tests.helpers.trace_helpers import estimate_holds_vision_trace, shipped_case_job  # noqa: E402

pytestmark = pytest.mark.torch
MAX_PCT = 3.0


def _job(case_id: str):
    return shipped_case_job("vlm-qwen2-vl.yaml", case_id)


@pytest.mark.parametrize("case_id", ["q2vl-full-nogc-448", "q2vl-lora-all-gc-896"])
def test_the_trace_of_today_agrees_with_the_estimate(case_id):
    job = _job(case_id)
    estimate_holds_vision_trace(job, MAX_PCT)

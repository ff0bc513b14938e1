"""LFM3-VL traced now against its estimate (estimator/cases/vlm-lfm3-vl.yaml): TRL's SFTTrainer with its vision
collator and transformers' Lfm3VlProcessor at 896×672 (2,352 patches), full fine-tuning without checkpointing (the
conv and attention layers' saved tensors alive) and LoRA on every linear under checkpointing (a recomputed layer and
its adapters). Both the step's peak and the tower's own backward (the vision layers above layer 0, whose phase also
holds the token embedding's gradient) within 3 %."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from tests.helpers.trace_helpers import estimate_holds_vision_trace, shipped_case_job  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.mark.parametrize("case_id", ["lfm3vl-full-nogc-896", "lfm3vl-lora-all-gc-896"])
def test_the_trace_of_today_agrees_with_the_estimate(case_id):
    estimate_holds_vision_trace(shipped_case_job("vlm-lfm3-vl.yaml", case_id), 3.0)

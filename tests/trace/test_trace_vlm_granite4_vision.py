"""Granite 4 Vision traced now against its estimate (estimator/cases/vlm-granite4-vision.yaml): TRL's SFTTrainer with
its vision collator and transformers' Granite4VisionProcessor at 896×672 (7 tiles, 4,032 patches, 936 image tokens),
full fine-tuning without checkpointing (the tower's and the eight Q-Former projectors' saved tensors alive) and LoRA
on every linear under checkpointing (checkpointed SigLIP and Q-Former layers, their adapters). Both the step's peak
and the tower's own backward (the vision layers above layer 0, beside the taps' waiting gradients) within 3 %."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from tests.helpers.trace_helpers import estimate_holds_vision_trace, shipped_case_job  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.mark.parametrize("case_id", ["g4v-full-nogc-896", "g4v-lora-all-gc-896"])
def test_the_trace_of_today_agrees_with_the_estimate(case_id):
    estimate_holds_vision_trace(shipped_case_job("vlm-granite4-vision.yaml", case_id), 3.0)

"""SmolVLM2 traced now against its estimate: TRL's SFTTrainer with its vision collator, transformers'
SmolVLMImageProcessorPil (longest_edge 1024, 512-px tiles: a 480×640 image is 2 × 2 tiles and a global one) and
Idefics3Processor on a real image, SmolVLM2-500M's widths cut to 1 decoder layer and 3 vision layers
(estimator/cases/vlm-smolvlm.yaml): full fine-tuning without checkpointing (every layer's saved tensors alive) and
LoRA on every linear under checkpointing (a recomputed layer and its adapters' gradients). Both the step's peak (LoRA:
step 2's) and the tower's own backward within 3 %."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from tests.helpers.trace_helpers import estimate_holds_vision_trace, shipped_case_job  # noqa: E402

pytestmark = pytest.mark.torch
MAX_PCT = 3.0


def _job(case_id: str):
    return shipped_case_job("vlm-smolvlm.yaml", case_id)


def test_full_fine_tuning_agrees_with_the_estimate():
    estimate_holds_vision_trace(_job("smolvlm-full-nogc-1024"), MAX_PCT)


def test_lora_under_checkpointing_agrees_with_step_2():
    """Step 2's peak and the tower's backward (the estimate models step 2; the trace's step 1 differs from it by
    the optimizer states that do not exist yet)."""
    from hpcmem.estimate import estimate
    from hpcmem.estimate.vision import VISION_BACKWARD
    from hpcmem.estimate.workspaces import tensor_bytes
    from hpcmem.trace.run import run_trace

    job = _job("smolvlm-lora-all-gc-1024")
    traced = run_trace(job, timeline=True)
    phases = {p.name: tensor_bytes(p) for p in estimate(job).phases}
    step_2 = max(p.current_bytes for p in traced.timeline if p.phase.startswith("step 2"))
    tower = max(p.current_bytes for p in traced.timeline
                if p.phase.startswith("step 2 / backward / vision block ") and not p.phase.endswith(" 0"))
    assert abs(max(phases.values()) - step_2) <= MAX_PCT / 100 * step_2, (max(phases.values()), step_2)
    assert abs(phases[VISION_BACKWARD] - tower) <= MAX_PCT / 100 * tower, (phases[VISION_BACKWARD], tower)


def test_the_tower_runs_forward_and_backward_under_checkpointing():
    """The model's test for all-zero (padding) tiles reads the batch's real pixel values (the oracle knows them), and
    the 3 vision layers run forward and, recomputed, backward."""
    from hpcmem.trace.run import run_trace

    traced = run_trace(_job("smolvlm-full-gc-1024"), timeline=True)
    forward = {p.phase for p in traced.timeline if p.phase.startswith("step 2 / forward / vision block ")}
    backward = {p.phase for p in traced.timeline if p.phase.startswith("step 2 / backward / vision block ")}
    assert forward == {f"step 2 / forward / vision block {i}" for i in range(3)}
    assert backward == {f"step 2 / backward / vision block {i}" for i in range(3)}

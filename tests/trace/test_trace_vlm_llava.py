"""llava-1.5 traced now against its estimate: TRL's SFTTrainer with its vision collator and transformers'
LlavaProcessor on real 336×336 images, llava-hf/llava-1.5-7b-hf's widths cut to 1 decoder layer and 4 CLIP layers
(estimator/cases/vlm-llava.yaml): full fine-tuning with 2 images per row without checkpointing (every trained CLIP
layer's saved tensors alive; the last layer runs but gets no backward: vision_feature_layer -2), LoRA on every linear
with 1 image under checkpointing (a recomputed layer and its adapters' gradients). Both the step's peak and the
tower's own backward (its layers from the last trained one down to layer 1) within 3 %."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from tests.helpers.trace_helpers import estimate_holds_vision_trace, shipped_case_job  # noqa: E402

pytestmark = pytest.mark.torch
MAX_PCT = 3.0


def _job(case_id: str):
    return shipped_case_job("vlm-llava.yaml", case_id)


@pytest.mark.parametrize("case_id", ["llava-full-nogc-2img", "llava-lora-all-gc-1img"])
def test_the_trace_of_today_agrees_with_the_estimate(case_id):
    estimate_holds_vision_trace(_job(case_id), MAX_PCT)


def test_the_layer_past_the_feature_layer_has_no_backward():
    """vision_feature_layer -2: the trace's backward names vision blocks 2, 1, 0 of the 4 it ran forward."""
    from hpcmem.trace.run import run_trace

    traced = run_trace(_job("llava-full-gc-1img"), timeline=True)
    forward = {p.phase for p in traced.timeline if p.phase.startswith("step 2 / forward / vision block ")}
    backward = {p.phase for p in traced.timeline if p.phase.startswith("step 2 / backward / vision block ")}
    assert len(forward) == 4
    assert backward == {f"step 2 / backward / vision block {i}" for i in range(3)}


def test_a_tower_no_adapter_reaches_builds_no_graph_without_checkpointing():
    """LoRA on gate_proj, up_proj (the decoder's MLP only), checkpointing off: nothing in the tower requires grad (no
    adapter, no `enable_input_require_grads` hook), so its layers keep nothing and run no backward — in the trace and
    in the estimate, which keeps only pixel_values and has no tower backward phase."""
    from hpcmem.estimate import estimate
    from hpcmem.estimate.vision import ACTIVATIONS, VISION_BACKWARD
    from hpcmem.trace.run import run_trace

    job = shipped_case_job("vlm-llava.yaml", None, trainer="sft", use_peft=True,
                           lora_target_modules=["gate_proj", "up_proj"], gradient_checkpointing=False,
                           images_per_example=1)
    traced = run_trace(job, timeline=True)
    live = {p.phase: p.current_bytes for p in traced.timeline}
    blocks = [live[f"step 2 / forward / vision block {i}"] for i in range(4)]
    # the blocks keep nothing for backward: what grows is at most the layers' outputs that `capture_outputs` records
    # for hidden_states, [577, 1024] bf16 each (one layer's saved tensors with LoRA all-linear are ~30 MiB)
    assert max(blocks) - min(blocks) <= 4 * 577 * 1024 * 2, blocks
    assert not any(p.startswith("step 2 / backward / vision block") for p in live)
    est = estimate(job)
    assert VISION_BACKWARD not in {p.name for p in est.phases}
    assert max(c.bytes for p in est.phases for c in p.components if c.name == ACTIVATIONS) == 3 * 336 * 336 * 4


def test_the_forward_holds_what_the_outputs_hold():
    """LoRA all-linear, no checkpointing, 2 images: at the LM head's forward the model's outputs still hold the last
    CLIP layer's saved tensors and the recorded hidden states (the estimate's forward-only component); the estimate's
    forward phase is within 3 % of the trace's largest live bytes there (without that component: −3.9 %)."""
    from hpcmem.estimate import estimate
    from hpcmem.estimate.names import FORWARD
    from hpcmem.estimate.workspaces import tensor_bytes
    from hpcmem.trace.run import run_trace

    job = _job("llava-lora-all-nogc-2img")
    traced = run_trace(job, timeline=True)
    head = max(p.current_bytes for p in traced.timeline if p.phase == "step 2 / forward / lm head / loss")
    forward = tensor_bytes(next(p for p in estimate(job).phases if p.name == FORWARD))
    assert abs(forward - head) <= MAX_PCT / 100 * head, (forward, head)

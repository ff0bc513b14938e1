"""LightOnOCR SFT with images (LightOnOCR-1B's widths cut to 1 decoder layer and 2 Pixtral layers) against the trace
of TRL's SFTTrainer with its vision collator and transformers' LightOnOcrProcessor on real images of 448×658 and
1540×1540 (estimator/traces/vlm-lighton-ocr.jsonl, written by `hpcmem validate trace --reserved --cases
estimator/cases/vlm-lighton-ocr.yaml`): full fine-tuning and LoRA all-linear, checkpointing on and off; DPO the same
way (TRL's DataCollatorForVisionPreference, each image repeated for chosen and rejected; vlm-lighton-ocr-dpo.yaml);
the patches, tokens, the reference's tower pass and what differs from Mistral 3 by hand; what is refused."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.estimate.vision import OPTIMIZER
from tests.helpers.stored_cases import estimated_tensor_peak, largest_component, stored_case_job, trace_records

ROOT = Path(__file__).resolve().parents[2]
RECORDS = trace_records(ROOT, "vlm-lighton-ocr", "vlm-lighton-ocr-dpo")
MAX_PCT = 3.0


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    traced = RECORDS[case_id]["traced"]
    estimated = estimated_tensor_peak(RECORDS[case_id], ROOT)
    assert abs(estimated - traced) <= MAX_PCT / 100 * traced, (estimated, traced)


def test_the_matrix_is_all_there():
    assert len(RECORDS) == 8 + 4


def test_the_patches_and_tokens_by_hand():
    """448×658 fits longest_edge 1540 and 658 = 14 · 47: 32 × 47 = 1,504 patches; LightOnOcrProcessor writes
    (448 // 28) · (658 // 28) = 16 · 23 = 368 image tokens and no breaks (the merger's unfold drops the odd column);
    pixel_values [1, 3, 448, 658] fp32 in the tower's backward."""
    est = estimate(stored_case_job(RECORDS["lo-full-nogc-448"], ROOT))
    vision = est.extra["vision"]
    assert (vision["patches_per_micro_batch"], vision["image_tokens_per_micro_batch"]) == (32 * 47, 16 * 23)
    assert largest_component(est, "pixel_values") == 3 * 448 * 658 * 4


def test_no_hidden_states_are_recorded():
    """LightOnOcrModel.get_image_features reads last_hidden_state: without checkpointing the tower's forward-only
    bytes have no (layers + 1) recorded outputs, where Mistral 3's tower (output_hidden_states) has 3 · 1540² / 14² ·
    1024 · 2 bytes at 1540 px and 2 layers."""
    job = stored_case_job(RECORDS["lo-full-nogc-1540"], ROOT)
    v = job.model.vision
    mistral = replace(job, model=replace(job.model, vision=replace(v, records_hidden_states=True)))
    n = 110 * 110
    name = "vision outputs (forward only)"
    assert all(c.name != name for p in estimate(job).phases for c in p.components)
    assert largest_component(estimate(mistral), name) == 3 * n * 1024 * 2


def test_dpo_reference_runs_the_tower_beside_the_policys_saved_tensors():
    """DPO's reference forward (adapters disabled, no grad) runs the tower on both copies of the 1540 px image while
    the policy's saved tensors are alive: N = 2 · 12,100 patches, bf16 throughout: patch_conv's output and ln_pre's
    (N · 1024 each), the [1, 1, N, N] mask, cos and sin [N, 64], and at block 1's MLP block 0's output, the attention's
    residual sum and ffn_norm's output (N · 1024 each) beside act(gate), up and their product (N · 4096 each). The
    language model's own no-grad pass runs after it and is not counted there."""
    n = 2 * 110 * 110
    est = estimate(stored_case_job(RECORDS["lo-dpo-lora-all-nogc-1540"], ROOT))
    phase = next(p for p in est.phases if p.name == "reference forward (vision tower)")
    tower = next(c.bytes for c in phase.components if c.name == "vision no-grad pass")
    assert tower == 2 * (5 * n * 1024 + n * n + 2 * n * 64 + 3 * n * 4096)
    assert all(c.name != "no-grad pass" for c in phase.components)


def test_full_fine_tuning_trains_the_whole_tower_and_projector():
    """Full fine-tuning: the trainable parameters off the decoder are patch_conv (3·14²·1024, no bias), ln_pre, both
    layers (q/k/v/o 1024², gate/up/down 1024 ↔ 4096, 2 RMSNorms, no biases) and the projector (its RMSNorm,
    merging_layer 4096 → 1024, linear_1 1024 → 1024, linear_2 1024 → 1024, no biases); AdamW keeps 2 states of the
    bf16 weights' dtype: 4 bytes each."""
    h, i, o = 1024, 4096, 1024
    embed = 3 * 14 * 14 * h + h
    layer = 4 * h * h + 3 * h * i + 2 * h
    projector = h + 4 * h * h + h * o + o * o
    job = stored_case_job(RECORDS["lo-full-nogc-448"], ROOT)
    assert largest_component(estimate(job), OPTIMIZER) == (embed + 2 * layer + projector) * 4


@pytest.mark.parametrize("trainer", ["grpo", "rloo"])
def test_other_trainers_with_images_are_refused(trainer):
    with pytest.raises(SpecError, match=f"with trainer {trainer} on lighton_ocr: hpcmem models lighton_ocr's images "
                                        "for sft, dpo only"):
        stored_case_job(RECORDS["lo-full-gc-448"], ROOT, trainer=trainer)


def test_pixel_bounds_are_refused():
    with pytest.raises(SpecError, match="min_pixels/max_pixels with lighton_ocr: PixtralImageProcessor has no such "
                                        "setting; it fits every image to 1540 px on its longest edge, its sides "
                                        "rounded up to 14-px steps"):
        stored_case_job(RECORDS["lo-full-gc-448"], ROOT, max_pixels=200_000)

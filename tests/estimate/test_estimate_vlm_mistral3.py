"""Mistral 3 SFT with images (Mistral-Small-3.1-24B's widths cut to 1 decoder layer and 2 Pixtral layers) against the
trace of TRL's SFTTrainer with its vision collator and transformers' PixtralProcessor on real images of 448×672 and
1540×1540 (estimator/traces/vlm-mistral3.jsonl, written by `hpcmem validate trace --cases
estimator/cases/vlm-mistral3.yaml`): full fine-tuning and LoRA all-linear, checkpointing on and off; DPO the same
way (TRL's DataCollatorForVisionPreference, each image repeated for chosen and rejected; vlm-mistral3-dpo.yaml); held
out at the full depth of mistralai/Mistral-Small-3.1-24B-Instruct-2503 (40 Mistral layers, 24 Pixtral layers;
vlm-mistral3-24b.yaml, traced after the estimate was settled on the cut); the patches,
tokens and trained parameters by hand; what is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.estimate.vision import ACTIVATIONS, OPTIMIZER
from tests.helpers.stored_cases import estimated_tensor_peak, largest_component, stored_case_job, trace_records

ROOT = Path(__file__).resolve().parents[2]
RECORDS = trace_records(ROOT, "vlm-mistral3", "vlm-mistral3-dpo", "vlm-mistral3-24b")
MAX_PCT = 3.0


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    traced = RECORDS[case_id]["traced"]
    estimated = estimated_tensor_peak(RECORDS[case_id], ROOT)
    assert abs(estimated - traced) <= MAX_PCT / 100 * traced, (estimated, traced)


def test_the_matrix_is_all_there():
    assert len(RECORDS) == 10 + 4 + 3


def test_dpo_runs_both_copies_under_one_mask():
    """DPO repeats each image for chosen and rejected: 2 × 12,100 patches at 1540 px run as one sequence, so the
    block-diagonal mask is [1, 1, 24200, 24200] bf16 — 4× one image's, not 2× — beside the rest of the tower's saved
    tensors (LoRA without checkpointing, dropout off as DPOTrainer's disable_dropout turns it off: the vision
    activations exceed twice the single-image SFT case's by the extra 2 × 12,100² × 2 bytes of mask; all else in the
    tower is linear in its rows)."""
    n = 110 * 110
    dpo = largest_component(estimate(stored_case_job(RECORDS["m3-dpo-lora-all-nogc-1540"], ROOT)), ACTIVATIONS)
    sft = largest_component(estimate(stored_case_job(RECORDS["m3-lora-all-nogc-1540"], ROOT, lora_dropout=0.0)),
                            ACTIVATIONS)
    assert dpo - 2 * sft == (2 * n) ** 2 * 2 - 2 * n * n * 2


def test_the_patches_and_tokens_by_hand():
    """1540×1540 fits longest_edge 1540: 110 × 110 = 12,100 patches of 14 px, 55 merged rows of 55 [IMG] and a
    break each = 3,080 tokens; pixel_values [1, 3, 1540, 1540] fp32 in the tower's backward."""
    est = estimate(stored_case_job(RECORDS["m3-full-nogc-1540"], ROOT))
    vision = est.extra["vision"]
    assert (vision["patches_per_micro_batch"], vision["image_tokens_per_micro_batch"]) == (110 * 110, 55 * 56)
    assert largest_component(est, "pixel_values") == 3 * 1540 * 1540 * 4


def test_the_decoders_target_names_reach_the_tower():
    """Pixtral's linears share the Mistral decoder's names (attention.q_proj …, feed_forward.gate_proj …), so peft's
    suffix match adapts them too: q_proj and v_proj reach two of the tower's linear kinds."""
    est = estimate(stored_case_job(RECORDS["m3-lora-all-gc-448"], ROOT, lora_target_modules=["q_proj", "v_proj"]))
    assert est.extra["vision"]["trained"] == "frozen; LoRA on 2 of its linear kinds"


def test_full_fine_tuning_trains_the_whole_tower_and_projector():
    """Full fine-tuning: the trainable parameters off the decoder are patch_conv (3·14²·1024, no bias), ln_pre, both
    layers (vision_feature_layer -1: q/k/v/o 1024², gate/up/down 1024 ↔ 4096, 2 RMSNorms, no biases) and the projector
    (its RMSNorm, merging_layer 4096 → 1024, linear_1 1024 → 5120, linear_2 5120 → 5120, no biases); AdamW keeps 2
    states of the bf16 weights' dtype: 4 bytes each."""
    h, i, o = 1024, 4096, 5120
    embed = 3 * 14 * 14 * h + h
    layer = 4 * h * h + 3 * h * i + 2 * h
    projector = h + 4 * h * h + h * o + o * o
    job = stored_case_job(RECORDS["m3-full-nogc-448"], ROOT)
    assert largest_component(estimate(job), OPTIMIZER) == (embed + 2 * layer + projector) * 4


@pytest.mark.parametrize("trainer", ["grpo", "rloo"])
def test_other_trainers_with_images_are_refused(trainer):
    with pytest.raises(SpecError, match=f"with trainer {trainer} on mistral3: hpcmem models mistral3's images for "
                                        "sft, dpo only"):
        stored_case_job(RECORDS["m3-full-gc-448"], ROOT, trainer=trainer)


def test_pixel_bounds_and_a_length_profile_are_refused():
    with pytest.raises(SpecError, match="min_pixels/max_pixels with mistral3: PixtralImageProcessor has no such "
                                        "setting; it fits every image to 1540 px on its longest edge"):
        stored_case_job(RECORDS["m3-full-gc-448"], ROOT, max_pixels=200_000)


def test_the_reference_pass_s_image_features_are_the_traced_live_tensors():
    """DPO LoRA all-linear without checkpointing at 1540 px (24,200 patches of width 1024, merged to 6,050 rows of the
    text width 5120, bf16): at the reference's first text layer the trace holds, born in the reference's image path,
    the tower's last_hidden_state 2 · 1024 · 24,200 = 49,561,600 B and the projector's output and its cat
    2 · 2 · 5120 · 6,050 = 123,904,000 B, and no other layer's output (read from the trace's live tensors at that
    instant; the hidden states `select_hidden_states` does not select are not kept)."""
    from hpcmem.estimate.trainers import REFERENCE_FORWARD
    from hpcmem.estimate.vision import REFERENCE_VISION

    phases = {p.name: p for p in estimate(stored_case_job(RECORDS["m3-dpo-lora-all-nogc-1540"], ROOT)).phases}
    held = [c.bytes for c in phases[REFERENCE_FORWARD].components if c.name == REFERENCE_VISION]
    assert held == [49_561_600 + 123_904_000]

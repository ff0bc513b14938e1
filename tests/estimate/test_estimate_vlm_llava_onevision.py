"""LLaVA-OneVision SFT with images (llava-onevision-qwen2-7b's widths cut to 1 decoder layer and 4 SigLIP layers)
against the trace of TRL's SFTTrainer with its vision collator and transformers' LlavaOnevisionProcessor on real
images of 384×768 (3 tiles) and 1152×1536 (13 tiles, the grid downscaled by anyres_max_9)
(estimator/traces/vlm-llava-onevision.jsonl, written by `hpcmem validate trace --cases
estimator/cases/vlm-llava-onevision.yaml`): full fine-tuning and LoRA all-linear, checkpointing on and off; DPO the
same way (TRL's DataCollatorForVisionPreference, each image repeated for chosen and rejected;
vlm-llava-onevision-dpo.yaml); held out at the full depth of llava-hf/llava-onevision-qwen2-7b-ov-hf (28 Qwen2
layers, 26 SigLIP layers; vlm-llava-onevision-7b.yaml, traced after the estimate was settled on the cut); the tiles
and the trained parameters by hand; what is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.estimate.vision import ACTIVATIONS, OPTIMIZER
from tests.helpers.stored_cases import estimated_tensor_peak, largest_component, stored_case_job, trace_records

ROOT = Path(__file__).resolve().parents[2]
RECORDS = trace_records(ROOT, "vlm-llava-onevision", "vlm-llava-onevision-dpo", "vlm-llava-onevision-7b")
MAX_PCT = 3.0


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    traced = RECORDS[case_id]["traced"]
    estimated = estimated_tensor_peak(RECORDS[case_id], ROOT)
    assert abs(estimated - traced) <= MAX_PCT / 100 * traced, (estimated, traced)


def test_the_matrix_is_all_there():
    assert len(RECORDS) == 8 + 2 + 4 + 8


def test_the_tiles_by_hand():
    """1152×1536: the 1152×1536 pinpoint's 3 × 4 tiles and the base image, 13 × 27² = 9,477 patches; the 81 × 108 grid
    downscaled to 70 × 93, 70 newlines and the base tile's 729 = 7,309 image tokens. A tower no adapter reaches
    without checkpointing keeps only pixel_values: [1, 13, 3, 384, 384] fp32."""
    job = stored_case_job(RECORDS["lov-full-nogc-13t"], ROOT, use_peft=True,
                          lora_target_modules=["gate_proj", "up_proj"], gradient_checkpointing=False)
    est = estimate(job)
    vision = est.extra["vision"]
    assert (vision["patches_per_micro_batch"], vision["image_tokens_per_micro_batch"]) == (13 * 729, 70 * 93 + 70 + 729)
    assert largest_component(est, ACTIVATIONS) == 13 * 3 * 384 * 384 * 4


def test_full_fine_tuning_trains_the_tower_but_post_layernorm():
    """Full fine-tuning: the trainable parameters off the decoder are the patch embedding (3·14²·1152 and its bias),
    the 729 positions, all 4 layers (vision_feature_layer -1: 4 linears 1152² + bias, fc1/fc2 1152 ↔ 4304 + bias,
    2 LayerNorms), the projector (1152 → 3584 → 3584 with biases) and the image_newline vector (3,584) — not
    post_layernorm (SigLIP has no pre-norm, and its post_layernorm feeds only last_hidden_state); AdamW keeps 2
    states of the bf16 weights' dtype: 4 bytes each."""
    h, i, o = 1152, 4304, 3584
    embed = 3 * 14 * 14 * h + h + 729 * h
    layer = 4 * (h * h + h) + (h * i + i) + (i * h + h) + 4 * h
    projector = (h * o + o) + (o * o + o)
    job = stored_case_job(RECORDS["lov-full-nogc-3t"], ROOT)
    assert largest_component(estimate(job), OPTIMIZER) == (embed + 4 * layer + projector + o) * 4


@pytest.mark.parametrize("trainer", ["grpo", "rloo"])
def test_other_trainers_with_images_are_refused(trainer):
    with pytest.raises(SpecError, match=f"with trainer {trainer} on llava_onevision: hpcmem models llava_onevision's "
                                        "images for sft, dpo only"):
        stored_case_job(RECORDS["lov-full-gc-3t"], ROOT, trainer=trainer)


def test_pixel_bounds_and_a_length_profile_are_refused():
    with pytest.raises(SpecError, match="min_pixels/max_pixels with llava_onevision: LlavaOnevisionImageProcessor has "
                                        "no such setting; it cuts every image into 384-px tiles"):
        stored_case_job(RECORDS["lov-full-gc-3t"], ROOT, max_pixels=200_000)
    with pytest.raises(SpecError, match="on llava_onevision: its images are read from images_per_example"):
        stored_case_job(RECORDS["lov-full-gc-3t"], ROOT, images_per_example=0, image_height=0, image_width=0,
                        profile_images=1, profile_patches=2187, profile_image_tokens=2214)

"""LLaVA-NeXT SFT with images (llava-hf/llava-v1.6-mistral-7b-hf's widths cut to 1 decoder layer and 4 CLIP layers;
its full depth held out) against the trace of TRL's SFTTrainer with its vision collator and transformers'
LlavaNextProcessor on real images of 336×672 (3 tiles) and 480×640 (5 tiles) (estimator/traces/vlm-llava-next*.jsonl,
written by `hpcmem validate trace --cases estimator/cases/vlm-llava-next.yaml`, `vlm-llava-next-7b.yaml`): full
fine-tuning and LoRA all-linear, checkpointing on and off; DPO the same way (TRL's DataCollatorForVisionPreference,
each image repeated for chosen and rejected; vlm-llava-next-dpo.yaml, vlm-llava-next-7b-dpo.yaml); the tiles by hand;
what is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.estimate.vision import ACTIVATIONS
from tests.helpers.stored_cases import estimated_tensor_peak, largest_component, stored_case_job, trace_records

ROOT = Path(__file__).resolve().parents[2]
RECORDS = trace_records(ROOT, "vlm-llava-next", "vlm-llava-next-7b", "vlm-llava-next-dpo", "vlm-llava-next-7b-dpo")
MAX_PCT = 3.0


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    traced = RECORDS[case_id]["traced"]
    estimated = estimated_tensor_peak(RECORDS[case_id], ROOT)
    assert abs(estimated - traced) <= MAX_PCT / 100 * traced, (estimated, traced)


def test_the_matrix_is_all_there():
    assert len(RECORDS) == 8 + 4 + 4 + 2


def test_the_tiles_by_hand():
    """480×640: the 672×672 pinpoint's 2 × 2 tiles and the base image, 5 × (336 / 14)² = 2,880 patches; 36 unpadded
    rows of 48, 36 newlines and the base tile's 576 = 2,340 image tokens. A tower no adapter reaches without
    checkpointing keeps only pixel_values: [1, 5, 3, 336, 336] fp32."""
    job = stored_case_job(RECORDS["lnext-full-nogc-5t"], ROOT, use_peft=True,
                          lora_target_modules=["gate_proj", "up_proj"], gradient_checkpointing=False)
    est = estimate(job)
    assert (est.extra["vision"]["patches_per_micro_batch"], est.extra["vision"]["image_tokens_per_micro_batch"]) == \
        (5 * 576, 36 * 48 + 36 + 576)
    assert largest_component(est, ACTIVATIONS) == 5 * 3 * 336 * 336 * 4


def test_full_fine_tuning_trains_the_image_newline():
    """Full fine-tuning: the tower's trainable parameters are those on the loss's path — the patch embedding
    (3·14²·1024, no bias), class embedding, 577 positions, pre_layrnorm, the 3 layers up to vision_feature_layer -2
    (4 linears 1024² + bias, fc1/fc2 1024 ↔ 4096 + bias, 2 LayerNorms), the projector (1024 → 4096 → 4096 with
    biases) — and the image_newline vector (4,096); AdamW keeps 2 states of the bf16 weights' dtype: 4 bytes each."""
    from hpcmem.estimate.vision import OPTIMIZER

    embed = 3 * 14 * 14 * 1024 + 1024 + 577 * 1024 + 2 * 1024
    layer = 4 * (1024 * 1024 + 1024) + (1024 * 4096 + 4096) + (4096 * 1024 + 1024) + 4 * 1024
    projector = (1024 * 4096 + 4096) + (4096 * 4096 + 4096)
    job = stored_case_job(RECORDS["lnext-full-nogc-3t"], ROOT)
    assert largest_component(estimate(job), OPTIMIZER) == (embed + 3 * layer + projector + 4096) * 4


@pytest.mark.parametrize("trainer", ["grpo", "rloo"])
def test_other_trainers_with_images_are_refused(trainer):
    with pytest.raises(SpecError, match=f"with trainer {trainer} on llava_next: hpcmem models llava_next's images "
                                        "for sft, dpo only"):
        stored_case_job(RECORDS["lnext-full-gc-3t"], ROOT, trainer=trainer)


def test_pixel_bounds_and_a_length_profile_are_refused():
    with pytest.raises(SpecError, match="min_pixels/max_pixels with llava_next: LlavaNextImageProcessor has no such "
                                        "setting; it cuts every image into 336-px tiles"):
        stored_case_job(RECORDS["lnext-full-gc-3t"], ROOT, max_pixels=200_000)
    with pytest.raises(SpecError, match="on llava_next: its images are read from images_per_example"):
        stored_case_job(RECORDS["lnext-full-gc-3t"], ROOT, images_per_example=0, image_height=0, image_width=0,
                        profile_images=1, profile_patches=2880, profile_image_tokens=2340)

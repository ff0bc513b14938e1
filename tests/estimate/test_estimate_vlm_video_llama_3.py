"""VideoLLaMA3 SFT with images (VideoLLaMA3-2B's widths cut to 1 decoder layer and 2 tower layers, 480×640 and
896×896 px) against the trace of TRL's SFTTrainer with its vision collator, transformers' VideoLlama3Processor and
VideoLlama3ImageProcessorPil (estimator/traces/vlm-video-llama-3.jsonl, written by `hpcmem validate trace --reserved
--cases estimator/cases/vlm-video-llama-3.yaml`): full fine-tuning and LoRA all-linear, checkpointing on and off; the
batch and the projector's saved tensors by hand; DPO and GRPO refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.estimate.lora import lora_layout
from hpcmem.estimate.vision import ACTIVATIONS
from hpcmem.estimate.vision_llava import tower_terms
from hpcmem.job.shape import precision
from tests.helpers.stored_cases import estimated_tensor_peak, largest_component, stored_case_job, trace_records

ROOT = Path(__file__).resolve().parents[2]
RECORDS = trace_records(ROOT, "vlm-video-llama-3")


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    traced = RECORDS[case_id]["traced"]
    estimated = estimated_tensor_peak(RECORDS[case_id], ROOT)
    assert abs(estimated - traced) <= 3 / 100 * traced, (estimated, traced)


def test_the_matrix_is_all_there():
    assert len(RECORDS) == 8


def test_the_images_by_hand():
    """One 480×640 image resized to 476×644: 34 × 46 = 1,564 patches and image tokens (merge_size 1). A tower no
    adapter reaches without checkpointing keeps only pixel_values, 1,564 × 3 · 14² fp32 bytes."""
    job = stored_case_job(RECORDS["vl3-480-full-nogc"], ROOT, use_peft=True, lora_target_modules=["gate_proj", "up_proj"],
                          gradient_checkpointing=False)
    est = estimate(job)
    assert (est.extra["vision"]["patches_per_micro_batch"], est.extra["vision"]["image_tokens_per_micro_batch"]) == \
        (1564, 1564)
    assert largest_component(est, ACTIVATIONS) >= 1564 * 588 * 4
    assert any(c.bytes == 1564 * 588 * 4 for p in est.phases for c in p.components if c.name == ACTIVATIONS)


def test_the_projector_keeps_its_inputs_when_it_trains():
    """Full fine-tuning against LoRA on q_proj and v_proj at 896 px (4,096 tokens): readout.0's output (GELU's input,
    [4096, 1536] bf16) is kept either way; pixel_unshuffle's copy of post_layernorm's output (readout.0's input,
    [4096, 1152] bf16) and GELU's output (readout.2's input, [4096, 1536] bf16) only when the readout trains."""
    full = stored_case_job(RECORDS["vl3-896-full-gc"], ROOT)
    lora = stored_case_job(RECORDS["vl3-896-full-gc"], ROOT, use_peft=True, lora_target_modules=["q_proj", "v_proj"])
    trained = tower_terms(full, precision(full), lora_layout(full)).merger_saved
    frozen = tower_terms(lora, precision(lora), lora_layout(lora)).merger_saved
    assert trained - frozen == 4096 * 1152 * 2 + 4096 * 1536 * 2


@pytest.mark.parametrize("trainer", ["dpo", "grpo"])
def test_other_trainers_with_images_are_refused(trainer):
    with pytest.raises(SpecError, match=f"with trainer {trainer} on video_llama_3: hpcmem models video_llama_3's "
                                        "images for sft only"):
        stored_case_job(RECORDS["vl3-480-full-gc"], ROOT, trainer=trainer)


def test_a_length_profile_of_images_is_refused():
    with pytest.raises(SpecError, match="its images are read from images_per_example"):
        stored_case_job(RECORDS["vl3-480-full-gc"], ROOT, images_per_example=0, profile_images=1,
                        profile_patches=1564, profile_image_tokens=1564)

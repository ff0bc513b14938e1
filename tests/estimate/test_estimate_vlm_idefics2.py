"""Idefics2 SFT with images (a cut config at SigLIP So400m/14 and Mistral-7B widths: 1 decoder layer, 2 tower layers,
the perceiver's 3 layers) against the trace of TRL's SFTTrainer with its vision collator, transformers'
Idefics2Processor and Idefics2ImageProcessorPil on blank images (estimator/traces/vlm-idefics2.jsonl, written by
`hpcmem validate trace --cases estimator/cases/vlm-idefics2.yaml`): full fine-tuning and LoRA all-linear,
checkpointing on and off, 448 and 980 px, several images and rows, LoRA q_proj/v_proj; DPO likewise
(vlm-idefics2-dpo.yaml, TRL's DataCollatorForVisionPreference); the batch and the adapters by hand; what is
refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from tests.helpers.stored_cases import estimated_tensor_peak, stored_case_job, trace_records

ROOT = Path(__file__).resolve().parents[2]
RECORDS = trace_records(ROOT, "vlm-idefics2", "vlm-idefics2-dpo")


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    traced = RECORDS[case_id]["traced"]
    estimated = estimated_tensor_peak(RECORDS[case_id], ROOT)
    assert abs(estimated - traced) <= 0.03 * traced, (estimated, traced)


PERCEIVER_PEAK = sorted(c for c, r in RECORDS.items() if r["traced_phase"] == "step 2 / backward / embeddings")


@pytest.mark.parametrize("case_id", PERCEIVER_PEAK)
def test_the_perceivers_backward_is_the_connector_backward_phase(case_id):
    """Seven stored cases (full fine-tuning and LoRA without dropout, 448-1,600 px) peak in the perceiver's backward,
    which the trace names after the text embeddings' (its gradient reaches the connector from there): the estimate's
    own phase for it, "backward (vision connector)", is within 3 % of that peak — not a neighbouring phase standing
    in for it (before its context norms' fp32 backward was modelled, the LoRA case's phase read −7.4 %)."""
    from hpcmem.estimate.workspaces import tensor_bytes

    traced = RECORDS[case_id]["traced"]
    phase = next(p for p in estimate(stored_case_job(RECORDS[case_id], ROOT)).phases
                 if p.name == "backward (vision connector)")
    assert abs(tensor_bytes(phase) - traced) <= 0.03 * traced, (tensor_bytes(phase), traced)


def test_the_matrix_is_all_there():
    assert len(RECORDS) == 15 + 6


def test_the_images_by_hand():
    """1200×1600 px: the longest side to 980, the other int(980 · 1200 / 1600) = 735 (above 378), so (735 // 14) ·
    (980 // 14) = 52 · 70 = 3,640 patches per image; each image 64 image tokens (the perceiver's latents)."""
    est = estimate(stored_case_job(RECORDS["i2-1200x1600-lora-all-gc-2img"], ROOT))
    vision = est.extra["vision"]
    assert (vision["resized"], vision["patches_per_image"], vision["tokens_per_image"]) == ([735, 980], 3640, 64)
    assert (vision["patches_per_micro_batch"], vision["image_tokens_per_micro_batch"]) == (2 * 3640, 2 * 64)


def test_the_connector_adapters_by_hand():
    """LoRA r16 on q_proj and v_proj reaches the tower's q/v_proj (1152 → 1152, 2 layers) and the perceiver's
    (4096 → 1536 and 4096 → 384, 3 layers): r · (in + out) each, trainable in the vision tower's optimizer states."""
    est = estimate(stored_case_job(RECORDS["i2-480x640-lora-qv-gc"], ROOT))
    params = 16 * (2 * 2 * (1152 + 1152) + 3 * ((4096 + 1536) + (4096 + 384)))
    assert est.extra["vision"]["trained"] == "frozen; LoRA on 4 of its linear kinds"
    states = next(c.bytes for p in est.phases for c in p.components if c.name == "vision tower optimizer states")
    assert states == params * 4 * 2         # AdamW's two fp32 moments of the fp32 adapters


@pytest.mark.parametrize("trainer", ["grpo", "rloo"])
def test_other_trainers_with_images_are_refused(trainer):
    with pytest.raises(SpecError, match=f"with trainer {trainer} on idefics2: hpcmem models idefics2's images for "
                                        "sft, dpo only"):
        stored_case_job(RECORDS["i2-448-full-gc"], ROOT, trainer=trainer)


def test_a_length_profile_of_its_images_is_refused():
    with pytest.raises(SpecError, match="on idefics2: its images are read from images_per_example"):
        stored_case_job(RECORDS["i2-448-full-gc"], ROOT, images_per_example=0, profile_images=1,
                        profile_patches=1024, profile_image_tokens=64)

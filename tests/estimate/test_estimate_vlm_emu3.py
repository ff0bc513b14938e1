"""Emu3 SFT and DPO with images on a learned text part (tests/fixtures/vlm/emu3-defaults-L2.json: two Emu3TextModel
layers of the text config class's widths, their terms from the learned profile in hpcmem/profiles/; the whole VQ-VAE
at Emu3VQVAEConfig's defaults) against the trace of TRL's SFTTrainer and DPOTrainer with their vision collators and
transformers' Emu3Processor on blank 512×512 and 480×640 images (estimator/traces/vlm-emu3.jsonl, written once by
`hpcmem validate trace --cases estimator/cases/vlm-emu3.yaml`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.validate.cases import case_job
from tests.helpers.stored_cases import assert_learned_case_holds, grpo_with_images_job, largest_component, trace_records

ROOT = Path(__file__).resolve().parents[2]
RECORDS = trace_records(ROOT, "vlm-emu3")
CUT = "tests/fixtures/vlm/emu3-defaults-L2.json"
CASE = {"trainer": "sft", "model_name_or_path": CUT, "dtype": "bfloat16", "bf16": True, "max_length": 5120,
        "per_device_train_batch_size": 1, "images_per_example": 1, "image_height": 512, "image_width": 512,
        "gradient_checkpointing": False}


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    assert_learned_case_holds(RECORDS[case_id], ROOT, max_pct=3.0)


def test_the_matrix_is_all_there():
    assert len(RECORDS) == 8 + 4
    assert {(r["case"]["image_height"], r["case"]["image_width"]) for r in RECORDS.values()} == {(512, 512),
                                                                                               (480, 640)}
    assert {r["cell"] for r in RECORDS.values()} == {f"{t}/{c}" for t in ("sft", "dpo")
                                                     for c in ("full+gc", "full+nogc", "lora+gc", "lora+nogc")}


def test_the_encoder_graph_by_hand():
    """Full fine-tuning, one 512² image: 4 frames (temporal_downsample_factor), bf16 under autocast. Each
    norm → swish → conv unit keeps 4 (GroupNorm's fp32 input copy) + 4 (sigmoid's fp32 output) + 4 (the in-place
    swish's clone) + 2 (the conv's bf16 input) = 14 bytes per element; nin_shortcut 2 more of its input; a downsample
    its bf16 padded input; an attention block (1024 wide, one head) 4 + 3 · 2 (q/k/v inputs) + 4 · 2 (q, k, v, SDPA's
    output) = 18 per element and a 4-byte logsumexp per row; conv_in its bf16 pixels."""
    from hpcmem.estimate.lora import LoraLayout
    from hpcmem.estimate.vision_emu3 import encoder_graph
    from hpcmem.job.shape import precision

    job = case_job(CASE)
    f, p0, p1, p2, p3 = 4, 512 * 512, 256 * 256, 128 * 128, 64 * 64
    attention = 18 * f * 1024 * p3 + 4 * f * p3
    by_hand = (2 * f * 3 * p0                                                           # conv_in
               + 2 * 28 * f * 256 * p0 + 2 * f * 256 * 513 * 513                        # level 0, downsample
               + (14 + 2) * f * 256 * p1 + 14 * f * 512 * p1 + 28 * f * 512 * p1 + 2 * f * 512 * 257 * 257
               + 2 * 28 * f * 512 * p2 + 2 * f * 512 * 129 * 129                        # level 2
               + (14 + 2) * f * 512 * p3 + 14 * f * 1024 * p3 + attention + 28 * f * 1024 * p3 + attention
               + 2 * 28 * f * 1024 * p3 + attention                                     # middle block
               + 14 * f * 1024 * p3)                                                    # norm_out, conv_out
    assert encoder_graph(job.model.vision, 1, 512, 512, precision(job), True, LoraLayout(enabled=False)) == by_hand
    assert by_hand / 2**30 == pytest.approx(25.5, abs=0.1)


def test_full_fine_tuning_peaks_in_the_forward_with_the_vq_graph():
    """The graph the argmin never runs backward dominates a full fine-tuning step: the peak is in the forward."""
    est = estimate(case_job(CASE))
    assert largest_component(est, "vision outputs (forward only)") > 20 * 2**30
    assert est.peak_phase.name.startswith("forward")


def test_grpo_with_images_is_refused():
    """SFT and DPO with images hold (the stored traces above); GRPO and RLOO with images are not traced: refused."""
    with pytest.raises(SpecError, match="with trainer grpo on emu3: hpcmem models emu3's images for sft, dpo only"):
        estimate(grpo_with_images_job(ROOT / CUT, 512, 512))

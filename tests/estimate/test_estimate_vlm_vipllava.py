"""ViP-LLaVA SFT and DPO with images (llava-hf/vip-llava-7b-hf's widths cut to 1 decoder layer and 12 CLIP layers)
against the trace of TRL's SFTTrainer / DPOTrainer with their vision collators and transformers' LlavaProcessor on real
336×336 images (estimator/traces/vlm-vipllava*.jsonl, written by `hpcmem validate trace --cases
estimator/cases/vlm-vipllava.yaml`, `vlm-vipllava-dpo.yaml`): full fine-tuning and LoRA all-linear, checkpointing on
and off, 1 and 2 images per row; held out at the published depth (32 decoder layers, 24 CLIP layers,
vlm-vipllava-7b.yaml); the trained parameters and the adapters by hand; what is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.estimate.vision import GRADIENTS, OPTIMIZER, WEIGHTS
from hpcmem.estimate.workspaces import tensor_bytes
from tests.helpers.stored_cases import largest_component, stored_case_job, trace_records

ROOT = Path(__file__).resolve().parents[2]
RECORDS = trace_records(ROOT, "vlm-vipllava", "vlm-vipllava-dpo", "vlm-vipllava-7b")
MAX_PCT = 3.0
H, I, O, K = 1024, 4096, 4096, 5        # CLIP width, CLIP MLP, Vicuna-7B width, feature layers (-2, -5, -8, -11, 6)
# one CLIPEncoderLayer: q/k/v/out_proj 1024² + bias, fc1/fc2 1024 ↔ 4096 + bias, two LayerNorms
LAYER = 4 * (H * H + H) + 2 * H * I + I + H + 4 * H
# patch Conv2d without bias, class embedding, (336 / 14)² + 1 positions, pre_layrnorm
EMBEDDINGS = 3 * 14 * 14 * H + H + 577 * H + 2 * H
# projector_layernorm over 5 · 1024, linear_1 5120 → 4096, linear_2 4096 → 4096, with bias
PROJECTOR = 2 * K * H + K * H * O + O + O * O + O


def _job(case_id: str, **changes):
    return stored_case_job(RECORDS[case_id], ROOT, **changes)


def test_the_matrix_is_all_there():
    assert len(RECORDS) == 8 + 4 + 4


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    traced = RECORDS[case_id]["traced"]
    estimated = max(tensor_bytes(p) for p in estimate(_job(case_id)).phases)
    assert abs(estimated - traced) <= MAX_PCT / 100 * traced, (estimated, traced)


def test_full_fine_tuning_trains_the_layers_up_to_the_deepest_feature_layer():
    """hidden_states[-2] of 12 layers is layer 11's output: layers 1–11, the embeddings and the projector get bf16
    gradients and two bf16 Adam moments; layer 12 and post_layernorm are loaded and get none."""
    est = estimate(_job("vip-full-gc-1img"))
    trained = EMBEDDINGS + 11 * LAYER + PROJECTOR
    assert largest_component(est, WEIGHTS) == 2 * (trained + LAYER + 2 * H)
    assert largest_component(est, GRADIENTS) == 2 * trained
    assert largest_component(est, OPTIMIZER) == 4 * trained


def test_lora_all_linear_adapts_the_tower_and_the_projector():
    """peft's all-linear: every q/k/v/out_proj, fc1, fc2 of the 12 layers and linear_1 (5120 → 4096), linear_2 (r 16,
    fp32); only the 11 layers on the loss's path and the projector's get gradients."""
    job = _job("vip-lora-all-gc-1img")
    r = job.train.lora_r
    per_layer = r * (4 * 2 * H + 2 * (H + I))
    merger = r * (K * H + O + 2 * O)
    est = estimate(job)
    assert largest_component(est, GRADIENTS) == 4 * (11 * per_layer + merger)
    assert largest_component(est, WEIGHTS) == 2 * (EMBEDDINGS + 12 * LAYER + 2 * H + PROJECTOR) \
        + 4 * (12 * per_layer + merger)


@pytest.mark.parametrize(("case_id", "images"), [("vip-full-nogc-1img", 1), ("vip-full-nogc-2img", 2),
                                                 ("vip-dpo-full-nogc-2img", 2 * 2)])
def test_the_image_tokens(case_id, images):
    """576 image tokens and patches per image (the class token always dropped); DPO repeats each image for chosen and
    rejected."""
    vision = estimate(_job(case_id)).extra["vision"]
    assert vision["image_tokens_per_micro_batch"] == vision["patches_per_micro_batch"] == 576 * images


@pytest.mark.parametrize(("changes", "words"), [
    ({"trainer": "grpo"}, "trainer grpo on vipllava: hpcmem models vipllava's images for sft, dpo only"),
    ({"max_pixels": 1_000_000}, "min_pixels/max_pixels with vipllava: CLIPImageProcessor has no such setting"),
    ({"max_length": 1024, "images_per_example": 2}, "1152 > max_length 1024"),
])
def test_what_is_not_modelled_is_a_one_line_refusal(changes, words):
    with pytest.raises(SpecError, match=words) as err:
        _job("vip-full-gc-1img", **changes)
    assert all("\n" not in p for p in err.value.problems)

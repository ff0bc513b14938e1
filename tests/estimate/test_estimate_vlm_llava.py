"""llava-1.5 SFT with images (llava-hf/llava-1.5-7b-hf's widths cut to 1 decoder layer and 4 CLIP layers) against the
trace of TRL's SFTTrainer with its vision collator and transformers' LlavaProcessor on real 336×336 images
(estimator/traces/vlm-llava.jsonl, written by `hpcmem validate trace --cases estimator/cases/vlm-llava.yaml`): full
fine-tuning and LoRA all-linear, checkpointing on and off, 1 and 2 images per row; the published depth (32 decoder
layers, 24 CLIP layers, vlm-llava-7b.yaml, held out); and the tower's states by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.estimate.vision import ACTIVATIONS, GRADIENTS, OPTIMIZER, WEIGHTS
from hpcmem.estimate.workspaces import tensor_bytes
from tests.helpers.stored_cases import largest_component, stored_case_job

ROOT = Path(__file__).resolve().parents[2]
TRACES = [ROOT / "estimator" / "traces" / f"{name}.jsonl" for name in ("vlm-llava", "vlm-llava-7b")]
RECORDS = {r["case"]["id"]: r for f in TRACES for r in map(json.loads, f.read_text().splitlines())}
MAX_PCT = 3.0
# one CLIP ViT-L/14-336 layer: q/k/v/out_proj 1024² + bias, fc1/fc2 1024 ↔ 4096 + bias, two LayerNorms
LAYER = 4 * (1024 * 1024 + 1024) + 2 * 1024 * 4096 + 4096 + 1024 + 4 * 1024
PROJECTOR = (1024 * 4096 + 4096) + (4096 * 4096 + 4096)
EMBEDDINGS = 3 * 14 * 14 * 1024 + 1024 + 577 * 1024     # patch Conv2d (no bias), class embedding, 577 positions


def _job(case_id: str, **changes):
    return stored_case_job(RECORDS[case_id], ROOT, **changes)


_component = largest_component


def test_the_matrix_is_all_there():
    assert len(RECORDS) == 10 + 4 + 2


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    traced = RECORDS[case_id]["traced"]
    estimated = max(tensor_bytes(p) for p in estimate(_job(case_id)).phases)
    assert abs(estimated - traced) <= MAX_PCT / 100 * traced, (estimated, traced)


def test_full_fine_tuning_trains_all_but_the_layer_past_the_feature_layer():
    """4 CLIP layers, vision_feature_layer -2: layers 0–2, the embeddings, pre_layrnorm and the projector get bf16
    gradients and two Adam moments each in the parameters' dtype (torch AdamW's `zeros_like(p)`: bf16); layer 3 and
    post_layernorm run but get none."""
    est = estimate(_job("llava-full-gc-1img"))
    trained = EMBEDDINGS + 2 * 1024 + 3 * LAYER + PROJECTOR
    assert _component(est, WEIGHTS) == 2 * (EMBEDDINGS + 4 * 1024 + 4 * LAYER + PROJECTOR)
    assert _component(est, GRADIENTS) == 2 * trained
    assert _component(est, OPTIMIZER) == 4 * trained


@pytest.mark.parametrize(("images", "case_id"), [(1, "llava-full-nogc-1img"), (2, "llava-full-nogc-2img")])
def test_pixel_values_and_image_tokens(images, case_id):
    """pixel_values fp32 [images, 3, 336, 336]; 576 image tokens per image, whatever image_height/width say."""
    est = estimate(_job(case_id))
    vision = est.extra["vision"]
    assert vision["image_tokens_per_micro_batch"] == 576 * images
    assert vision["tokens_per_image"] == 576 and vision["resized"] == [336, 336]
    assert est.extra["vision"] == estimate(_job(case_id, image_height=900, image_width=1600)).extra["vision"]
    pixels = next(c for p in est.phases for c in p.components if c.name == "pixel_values")
    assert pixels.bytes == images * 3 * 336 * 336 * 4


def test_lora_all_linear_adapts_the_tower_and_the_projector():
    """peft's all-linear: every q/k/v/out_proj, fc1, fc2 of the 4 CLIP layers and linear_1, linear_2 (r 16, fp32
    adapters); gradients only for the adapters on the loss's path (layers 0–2 and the projector)."""
    job = _job("llava-lora-all-gc-1img")
    est = estimate(job)
    r = job.train.lora_r
    layer = r * (4 * 2048 + 2 * (1024 + 4096))
    projector = r * ((1024 + 4096) + (4096 + 4096))
    assert _component(est, GRADIENTS) == 4 * (3 * layer + projector)
    assert _component(est, WEIGHTS) == 2 * (EMBEDDINGS + 4 * 1024 + 4 * LAYER + PROJECTOR) + 4 * (4 * layer + projector)
    assert ACTIVATIONS in {c.name for p in est.phases for c in p.components}


def test_grpo_with_llava_images_is_a_one_line_refusal():
    with pytest.raises(SpecError, match="with trainer grpo on llava: hpcmem models llava's images for sft, dpo only"):
        _job("llava-full-gc-1img", trainer="grpo", max_length=None, max_prompt_length=1024, max_completion_length=64)

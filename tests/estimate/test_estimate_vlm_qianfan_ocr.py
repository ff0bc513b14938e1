"""Qianfan-OCR SFT and DPO with images (QianfanOCRConfig's default widths cut to 1 Qwen3 decoder layer and 2 vision
layers) against the trace of TRL's SFTTrainer / DPOTrainer with their vision collators, transformers'
GotOcr2ImageProcessorPil and QianfanOCRProcessor on real images (estimator/traces/vlm-qianfan-ocr.jsonl and
vlm-qianfan-ocr-dpo.jsonl, written by `hpcmem validate trace --reserved --cases estimator/cases/vlm-qianfan-ocr*.yaml`):
full fine-tuning and LoRA all-linear, checkpointing on and off, 448×896 (3 tiles) and 800×1200 (7 tiles); the
tower's states and the batch by hand; what is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.estimate.vision import GRADIENTS, OPTIMIZER, WEIGHTS
from hpcmem.estimate.workspaces import tensor_bytes
from tests.helpers.stored_cases import largest_component, stored_case_job, trace_records

ROOT = Path(__file__).resolve().parents[2]
RECORDS = trace_records(ROOT, "vlm-qianfan-ocr", "vlm-qianfan-ocr-dpo")
MAX_PCT = 3.0
H, I, O = 1024, 4096, 4096
# one vision layer: q/k/v (attention_bias True by default) and projection_layer 1024² + bias, fc1/fc2 1024 ↔ 4096 +
# bias, two LayerNorms, lambda_1/2; DropPath has no parameters
LAYER = 4 * (H * H + H) + 2 * H * I + I + H + 4 * H + 2 * H
# class token, patch Conv2d with bias, (448 / 14)² + 1 positions
EMBEDDINGS = H + 3 * 14 * 14 * H + H + 1025 * H
# LayerNorm over 4 · 1024, linear_1 4096 → 4096 (Qwen3Config's hidden_size), linear_2 4096 → 4096, with bias
PROJECTOR = 2 * 4 * H + 4 * H * O + O + O * O + O


def _job(case_id: str, **changes):
    return stored_case_job(RECORDS[case_id], ROOT, **changes)


def test_the_matrix_is_all_there():
    assert len(RECORDS) == 8 + 4


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    traced = RECORDS[case_id]["traced"]
    estimated = max(tensor_bytes(p) for p in estimate(_job(case_id)).phases)
    assert abs(estimated - traced) <= MAX_PCT / 100 * traced, (estimated, traced)


def test_full_fine_tuning_trains_the_tower_and_the_projector():
    """Every layer (its layer-scale vectors too), the embeddings and the projector get bf16 gradients and two bf16
    Adam moments."""
    est = estimate(_job("qianfan-full-gc-3t"))
    trained = EMBEDDINGS + 2 * LAYER + PROJECTOR
    assert largest_component(est, WEIGHTS) == 2 * trained
    assert largest_component(est, GRADIENTS) == 2 * trained
    assert largest_component(est, OPTIMIZER) == 4 * trained


@pytest.mark.parametrize(("case_id", "tiles", "rows"), [("qianfan-full-nogc-7t", 7, 1),
                                                        ("qianfan-dpo-lora-all-gc-7t", 7, 2)])
def test_the_batch_and_the_image_tokens(case_id, tiles, rows):
    """256 image tokens and 32² patches per 448-px tile (an 800×1200 image: 3 × 2 tiles and a thumbnail); DPO's
    collator tiles each image for its chosen and its rejected row; SFT's pixel_values fp32."""
    est = estimate(_job(case_id))
    vision = est.extra["vision"]
    assert vision["image_tokens_per_micro_batch"] == rows * 256 * tiles
    assert vision["patches_per_micro_batch"] == rows * 1024 * tiles
    if rows == 1:
        pixels = next(c for p in est.phases for c in p.components if c.name == "pixel_values")
        assert pixels.bytes == tiles * 3 * 448 * 448 * 4


def test_lora_all_linear_adapts_the_tower_and_the_projector():
    """peft's all-linear: every q/k/v_proj, projection_layer, fc1, fc2 of the 2 layers and linear_1, linear_2 (r 16,
    fp32)."""
    job = _job("qianfan-lora-all-gc-3t")
    r = job.train.lora_r
    adapters = r * (2 * (4 * 2 * H + 2 * (H + I)) + (4 * H + O) + 2 * O)
    est = estimate(job)
    assert largest_component(est, GRADIENTS) == 4 * adapters
    assert largest_component(est, WEIGHTS) == 2 * (EMBEDDINGS + 2 * LAYER + PROJECTOR) + 4 * adapters


@pytest.mark.parametrize(("changes", "words"), [
    ({"trainer": "grpo"}, "qianfan_ocr"),
    ({"max_length": 512}, "768 image tokens"),
])
def test_what_is_not_modelled_is_a_one_line_refusal(changes, words):
    with pytest.raises(SpecError, match=words) as err:
        _job("qianfan-full-gc-3t", **changes)
    assert all("\n" not in p for p in err.value.problems)

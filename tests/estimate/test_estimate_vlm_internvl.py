"""InternVL SFT with images (InternVL3-8B's widths cut to 1 decoder layer and 2 InternViT layers) against the trace of
TRL's SFTTrainer with its vision collator, transformers' GotOcr2ImageProcessorPil and InternVLProcessor on real images
(estimator/traces/vlm-internvl.jsonl, written by `hpcmem validate trace --cases estimator/cases/vlm-internvl.yaml`):
full fine-tuning and LoRA all-linear, checkpointing on and off, 448×896 (3 tiles) and 800×1200 (7 tiles); DPO through
TRL's DataCollatorForVisionPreference (vlm-internvl-dpo.yaml, each image tiled for chosen and rejected); held out at
the published depth (OpenGVLab/InternVL3-8B-hf: 28 decoder layers, 24 InternViT layers, vlm-internvl-8b.yaml); the
tower's states and the batch by hand; what is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.estimate.vision import GRADIENTS, OPTIMIZER, WEIGHTS
from hpcmem.estimate.workspaces import tensor_bytes
from hpcmem.validate.cases import case_job
from tests.helpers.stored_cases import largest_component, stored_case_job, trace_records

ROOT = Path(__file__).resolve().parents[2]
RECORDS = trace_records(ROOT, "vlm-internvl", "vlm-internvl-dpo", "vlm-internvl-8b")
MAX_PCT = 3.0
H, I, O = 1024, 4096, 3584
# one InternViT-300M layer: q/k/v/projection_layer 1024² + bias, fc1/fc2 1024 ↔ 4096 + bias, two LayerNorms, lambda_1/2
LAYER = 4 * (H * H + H) + 2 * H * I + I + H + 4 * H + 2 * H
# class token, patch Conv2d with bias, (448 / 14)² + 1 positions
EMBEDDINGS = H + 3 * 14 * 14 * H + H + 1025 * H
# LayerNorm over 4 · 1024, linear_1 4096 → 3584, linear_2 3584 → 3584, with bias
PROJECTOR = 2 * 4 * H + 4 * H * O + O + O * O + O


def _job(case_id: str, **changes):
    return stored_case_job(RECORDS[case_id], ROOT, **changes)


def test_the_matrix_is_all_there():
    assert len(RECORDS) == 8 + 4 + 4


def test_dpo_tiles_each_image_for_chosen_and_rejected():
    """DataCollatorForVisionPreference repeats each example's image for its chosen and its rejected row: 2 × 7 tiles
    through the tower, 7 × 256 image tokens in each row's prompt."""
    vision = estimate(_job("internvl-dpo-lora-all-gc-7t")).extra["vision"]
    assert vision["patches_per_micro_batch"] == 2 * 7 * 1024
    assert vision["image_tokens_per_micro_batch"] == 2 * 7 * 256


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    traced = RECORDS[case_id]["traced"]
    estimated = max(tensor_bytes(p) for p in estimate(_job(case_id)).phases)
    assert abs(estimated - traced) <= MAX_PCT / 100 * traced, (estimated, traced)


def test_full_fine_tuning_trains_the_tower_and_the_projector():
    """Every layer (its layer-scale vectors too), the embeddings and the projector get bf16 gradients and two bf16
    Adam moments; `layernorm` is an nn.Identity (use_mean_pooling)."""
    est = estimate(_job("internvl-full-gc-3t"))
    trained = EMBEDDINGS + 2 * LAYER + PROJECTOR
    assert largest_component(est, WEIGHTS) == 2 * trained
    assert largest_component(est, GRADIENTS) == 2 * trained
    assert largest_component(est, OPTIMIZER) == 4 * trained


@pytest.mark.parametrize(("case_id", "tiles"), [("internvl-full-nogc-3t", 3), ("internvl-full-nogc-7t", 7)])
def test_the_batch_and_the_image_tokens(case_id, tiles):
    """pixel_values fp32 [tiles, 3, 448, 448]; 256 image tokens and 32² patches (the tower runs the class token
    besides) per tile."""
    est = estimate(_job(case_id))
    vision = est.extra["vision"]
    assert vision["image_tokens_per_micro_batch"] == 256 * tiles
    assert vision["patches_per_micro_batch"] == 1024 * tiles
    pixels = next(c for p in est.phases for c in p.components if c.name == "pixel_values")
    assert pixels.bytes == tiles * 3 * 448 * 448 * 4


def test_lora_all_linear_adapts_the_tower_and_the_projector():
    """peft's all-linear: every q/k/v_proj, projection_layer, fc1, fc2 of the 2 layers and linear_1, linear_2 (r 16,
    fp32)."""
    job = _job("internvl-lora-all-gc-3t")
    r = job.train.lora_r
    adapters = r * (2 * (4 * 2 * H + 2 * (H + I)) + (4 * H + O) + 2 * O)
    est = estimate(job)
    assert largest_component(est, GRADIENTS) == 4 * adapters
    assert largest_component(est, WEIGHTS) == 2 * (EMBEDDINGS + 2 * LAYER + PROJECTOR) + 4 * adapters


@pytest.mark.parametrize(("changes", "words"), [
    ({"trainer": "grpo"}, "trainer grpo on internvl: hpcmem models internvl's images for sft, dpo only"),
    ({"trainer": "kto"}, "trainer kto on internvl: hpcmem models internvl's images for sft, dpo only"),
    ({"max_pixels": 1_000_000}, "GotOcr2ImageProcessor has no such setting"),
    ({"max_length": 512}, "768 image tokens"),
])
def test_what_is_not_modelled_is_a_one_line_refusal(changes, words):
    with pytest.raises(SpecError, match=words) as err:
        _job("internvl-full-gc-3t", **changes)
    assert all("\n" not in p for p in err.value.problems)


@pytest.mark.parametrize(("vision", "words"), [
    ({"norm_type": "rms_norm"}, "InternVLVisionRMSNorm"),
    ({"use_qk_norm": True}, "q/k RMSNorms"),
    ({"use_mean_pooling": False}, "use_mean_pooling false"),
    ({"image_size": 462}, "not a multiple of 1 / downsample_ratio"),
])
def test_towers_not_derived_are_refused_with_images(vision, words, tmp_path):
    cfg = json.loads((ROOT / "tests" / "fixtures" / "vlm" / "internvl3-8b-width-L1-D2.json").read_text())
    cfg["vision_config"].update(vision)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(SpecError, match=words):
        case_job({**RECORDS["internvl-full-gc-3t"]["case"], "model_name_or_path": str(path)})

"""Janus SFT and DPO with images (Janus-Pro-1B's widths cut to 1 decoder layer and 4 tower layers, 384 and 512 px)
against the trace of TRL's SFTTrainer / DPOTrainer with their vision collators, transformers' JanusProcessor and
JanusImageProcessorPil on real 480×640 images (estimator/traces/vlm-janus*.jsonl, written by
`hpcmem validate trace --cases estimator/cases/vlm-janus.yaml`, `-dpo.yaml`, and `-pro-1b.yaml` held out at the
catalog's full depth): full fine-tuning and LoRA all-linear, checkpointing on and off; the batch and the idle
generation parts by hand; what is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.estimate.lora import lora_layout
from hpcmem.estimate.vision_llava import tower_terms
from hpcmem.job.shape import precision
from hpcmem.models.resolve import catalog
from tests.helpers.stored_cases import estimated_tensor_peak, stored_case_job, trace_records

ROOT = Path(__file__).resolve().parents[2]
RECORDS = trace_records(ROOT, "vlm-janus", "vlm-janus-dpo", "vlm-janus-pro-1b")


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    traced = RECORDS[case_id]["traced"]
    estimated = estimated_tensor_peak(RECORDS[case_id], ROOT)
    assert abs(estimated - traced) <= 3 / 100 * traced, (estimated, traced)


def test_the_matrix_is_all_there():
    assert len(RECORDS) == 8 + 4 + 4


@pytest.mark.parametrize(("case_id", "images"), [("janus384-full-nogc", 1), ("janus-dpo-full-nogc-384", 2)])
def test_the_images_by_hand(case_id, images):
    """One 480×640 image per row resized and padded to 384 px: (384 / 16)² = 576 patches and image tokens; DPO runs
    each image for chosen and rejected."""
    est = estimate(stored_case_job(RECORDS[case_id], ROOT))
    assert (est.extra["vision"]["patches_per_micro_batch"], est.extra["vision"]["image_tokens_per_micro_batch"]) == \
        (images * 576, images * 576)


def test_the_idle_generation_parts_are_weights_without_gradients():
    """Full fine-tuning in bf16: the tower (51,764,224 parameters at 384 px) and the aligner (6,295,552) get gradients;
    the VQ model and the generation embeddings, aligner and head (113,996,427, counted against the meta model in
    tests/models/test_janus_params.py) are resident weights only."""
    job = stored_case_job(RECORDS["janus384-full-gc"], ROOT)
    terms = tower_terms(job, precision(job), lora_layout(job))
    assert terms.weights == (51_764_224 + 6_295_552 + 113_996_427) * 2
    assert terms.gradients == (51_764_224 + 6_295_552) * 2


def test_all_linear_adapts_the_generation_linears_without_gradients():
    """LoRA r16 all-linear: per tower layer q/k/v/projection_layer 4 · 16 · (1024 + 1024), fc1 and fc2 2 · 16 ·
    (1024 + 4096), four layers; the aligner 16 · (1024 + 2048) + 16 · (2048 + 2048): these train. peft also wraps
    generation_aligner.fc1 16 · (8 + 2048), .hidden_layers.0 and generation_head.proj_out 16 · (2048 + 2048) each, and
    vision_head 16 · (2048 + 16384): loaded, never run, no gradient."""
    job = stored_case_job(RECORDS["janus384-lora-all-gc"], ROOT)
    lora = lora_layout(job)
    terms = tower_terms(job, precision(job), lora)
    trained = 4 * (4 * 16 * 2048 + 2 * 16 * 5120) + 16 * 3072 + 16 * 4096
    idle = 16 * 2056 + 2 * 16 * 4096 + 16 * 18432
    assert terms.gradients == trained * lora.adapter_bytes
    assert terms.weights == (51_764_224 + 6_295_552 + 113_996_427) * 2 + (trained + idle) * lora.adapter_bytes


def test_the_held_out_shape_is_the_catalog_entry():
    """tests/fixtures/vlm/janus-pro-1b-shape.json, which the held-out cases trace, is the catalog's config."""
    shape = json.loads((ROOT / "tests/fixtures/vlm/janus-pro-1b-shape.json").read_text())
    assert shape == catalog()["deepseek-community/Janus-Pro-1B"]["config"]


def test_grpo_with_images_is_refused():
    with pytest.raises(SpecError, match="with trainer grpo on janus: hpcmem models janus's images for sft, dpo only"):
        stored_case_job(RECORDS["janus384-full-gc"], ROOT, trainer="grpo")

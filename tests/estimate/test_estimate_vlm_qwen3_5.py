"""Qwen3.5 and Qwen3.5-MoE SFT and DPO with images on a learned text part (tests/fixtures/vlm/
qwen3_5-defaults-L2-D2.json and qwen3_5_moe-defaults-L2-D2.json: one Gated DeltaNet and one full-attention layer of the text config classes'
widths, their terms from the learned profiles in hpcmem/profiles/; Qwen3-VL's tower cut to 2 blocks, no deepstack
mergers) against the trace of TRL's trainers with their vision collators and transformers' Qwen3VLProcessor on blank
448×448 and 896×896 images (estimator/traces/vlm-qwen3-5.jsonl and vlm-qwen3-5-moe.jsonl, written by `hpcmem validate
trace --cases estimator/cases/vlm-qwen3-5.yaml` and vlm-qwen3-5-moe.yaml); the merger's saved tensors by hand; what is
refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.estimate.lora import lora_layout
from hpcmem.estimate.vision_llava import tower_terms
from hpcmem.job.shape import precision
from hpcmem.validate.cases import case_job
from tests.helpers.stored_cases import assert_learned_case_holds, trace_records

ROOT = Path(__file__).resolve().parents[2]
RECORDS = trace_records(ROOT, "vlm-qwen3-5", "vlm-qwen3-5-moe")
CUT = "tests/fixtures/vlm/qwen3_5-defaults-L2-D2.json"


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    assert_learned_case_holds(RECORDS[case_id], ROOT)


def test_the_matrix_is_all_there():
    assert len(RECORDS) == 24
    for cut in ("qwen3_5-defaults-L2-D2.json", "qwen3_5_moe-defaults-L2-D2.json"):
        mine = [r["case"] for r in RECORDS.values() if r["case"]["model_name_or_path"].endswith(cut)]
        assert len(mine) == 12 and {c["image_width"] for c in mine} == {448, 896}
        assert sorted(c["trainer"] for c in mine) == ["dpo"] * 4 + ["sft"] * 8


def _job(trainer="sft", **kw):
    return case_job({"trainer": trainer, "model_name_or_path": str(ROOT / CUT), "max_length": 1536,
                     "images_per_example": 1, "image_height": 896, "image_width": 896, "dtype": "bfloat16",
                     "bf16": True, "per_device_train_batch_size": 1, **kw})


def test_the_merger_keeps_by_hand():
    """Full fine-tuning, one 896×896 image: 3,136 tower rows of width 1152, bf16 under autocast.
    Qwen3VLVisionPatchMerger (use_postshuffle_norm False): its LayerNorm over 1152 keeps its input cast to fp32 and
    fp32 mean and rstd, and its bf16 output for linear_fc1 (4 · 1152 + 8 + 2 · 1152 bytes a row); on the 784 merged
    rows of 4608 linear_fc1's output (GELU's input) and GELU's output (linear_fc2's input), the bytes of two [3136,
    1152] bf16 tensors. No deepstack merger: Qwen3_5VisionModel deletes them."""
    job = _job(gradient_checkpointing=True)
    terms = tower_terms(job, precision(job), lora_layout(job))
    assert terms.merger_saved == 3136 * (4 * 1152 + 8 + 2 * 1152) + 2 * (2 * 1152 * 3136)
    assert terms.deepstack == () and terms.image_tokens == 784


def test_the_tower_trains_whole_and_frozen_under_lora():
    """Full fine-tuning: bf16 gradients of every tower and merger parameter. LoRA all-linear: the tower's base
    weights frozen, its adapters' gradients only."""
    full = _job(gradient_checkpointing=False)
    v = full.model.vision
    assert tower_terms(full, precision(full), lora_layout(full)).gradients == 2 * v.num_params
    lora = _job(gradient_checkpointing=False, use_peft=True, lora_target_modules="all-linear")
    adapters = sum(16 * (x.in_features + x.out_features) * x.count for x in v.linears())
    assert tower_terms(lora, precision(lora), lora_layout(lora)).gradients == adapters * lora_layout(lora).adapter_bytes


@pytest.mark.parametrize("trainer", ["kto"])
def test_other_trainers_with_images_are_refused(trainer):
    """KTO with images: not modelled (GRPO and RLOO: their own cases, estimator/cases/vlm-qwen3-5-grpo.yaml and
    vlm-qwen3-5-rloo.yaml, held in tests/estimate/test_estimate_vlm_grpo.py)."""
    job = {"trainer": trainer, "model_name_or_path": str(ROOT / CUT), "max_length": 1152,
           "per_device_train_batch_size": 2, "images_per_example": 1, "image_height": 448, "image_width": 448,
           "dtype": "bfloat16", "bf16": True}
    with pytest.raises(SpecError) as refused:
        estimate(case_job(job))
    assert refused.value.problems == [f"images_per_example 1 with trainer {trainer} on qwen3_5: hpcmem models "
                                      "qwen3_5's images for sft, dpo, grpo, rloo only"]

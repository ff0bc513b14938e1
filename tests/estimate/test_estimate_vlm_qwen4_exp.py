"""Qwen4-Exp SFT and DPO with images on a learned text part (tests/fixtures/vlm/qwen4_exp-defaults-L2-D2.json: one
Gated DeltaNet and one QSA-indexed attention layer of the text config class's widths — 512 routed experts and a shared
one, 4 hyper-connection streams — their terms from the learned profile in hpcmem/profiles/; Qwen3.5's tower cut to 2
blocks, no deepstack mergers) against the trace of TRL's trainers with their vision collators and transformers'
Qwen3VLProcessor on blank 448×448 and 640×640 images (estimator/traces/vlm-qwen4-exp.jsonl, written by `hpcmem validate
trace --cases estimator/cases/vlm-qwen4-exp.yaml --reserved`); the merger's saved tensors by hand; what is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.estimate.lora import lora_layout
from hpcmem.estimate.vision_llava import tower_terms
from hpcmem.job.shape import precision
from hpcmem.validate.cases import case_job
from tests.helpers.stored_cases import assert_learned_case_holds, assert_matrix, grpo_with_images_job, trace_records

ROOT = Path(__file__).resolve().parents[2]
RECORDS = trace_records(ROOT, "vlm-qwen4-exp")
CUT = "tests/fixtures/vlm/qwen4_exp-defaults-L2-D2.json"


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    assert_learned_case_holds(RECORDS[case_id], ROOT)


def test_the_matrix_is_all_there():
    assert_matrix(RECORDS, 12, {(448, 448), (640, 640)}, (0, 0),
                  {f"{t}/{c}" for t in ("sft", "dpo") for c in ("full+gc", "full+nogc", "lora+gc", "lora+nogc")})
    assert sorted(r["case"]["trainer"] for r in RECORDS.values()) == ["dpo"] * 4 + ["sft"] * 8


def _job(trainer="sft", **kw):
    return case_job({"trainer": trainer, "model_name_or_path": str(ROOT / CUT), "max_length": 512,
                     "images_per_example": 1, "image_height": 640, "image_width": 640, "dtype": "bfloat16",
                     "bf16": True, "per_device_train_batch_size": 1, **kw})


def test_the_merger_keeps_by_hand():
    """Full fine-tuning, one 640×640 image: 40 × 40 = 1,600 tower rows of width 1152, bf16 under autocast, 400 merged
    tokens. Qwen3VLVisionPatchMerger (use_postshuffle_norm False; Qwen4ExpVisionModel is Qwen3.5's tower): its
    LayerNorm over 1152 keeps its input cast to fp32 and fp32 mean and rstd, and its bf16 output for linear_fc1
    (4 · 1152 + 8 + 2 · 1152 bytes a row); on the 400 merged rows of 4608 linear_fc1's output (GELU's input) and
    GELU's output (linear_fc2's input), the bytes of two [1600, 1152] bf16 tensors. No deepstack merger."""
    job = _job(gradient_checkpointing=True)
    terms = tower_terms(job, precision(job), lora_layout(job))
    assert terms.merger_saved == 1600 * (4 * 1152 + 8 + 2 * 1152) + 2 * (2 * 1152 * 1600)
    assert terms.deepstack == () and terms.image_tokens == 400


def test_the_tower_trains_whole_and_frozen_under_lora():
    """Full fine-tuning: bf16 gradients of every tower and merger parameter. LoRA all-linear: the tower's base
    weights frozen, its adapters' gradients only."""
    full = _job(gradient_checkpointing=False)
    v = full.model.vision
    assert tower_terms(full, precision(full), lora_layout(full)).gradients == 2 * v.num_params
    lora = _job(gradient_checkpointing=False, use_peft=True, lora_target_modules="all-linear")
    adapters = sum(16 * (x.in_features + x.out_features) * x.count for x in v.linears())
    assert tower_terms(lora, precision(lora), lora_layout(lora)).gradients == adapters * lora_layout(lora).adapter_bytes


def test_grpo_with_images_is_refused():
    """SFT and DPO with images are traced (above); GRPO and RLOO with images are not: refused."""
    with pytest.raises(SpecError, match="with trainer grpo on qwen4_exp: hpcmem models qwen4_exp's images "
                                        "for sft, dpo only"):
        estimate(grpo_with_images_job(ROOT / CUT, 448, 448))

"""Ovis2 SFT and DPO with images (Ovis2-2B's widths cut to 1 decoder layer and 2 tower layers, 448 and 560 px)
against the trace of TRL's SFTTrainer / DPOTrainer with their vision collators, transformers' Ovis2Processor and
Ovis2ImageProcessorPil on real 480×640 images (estimator/traces/vlm-ovis2*.jsonl, written by
`hpcmem validate trace --cases estimator/cases/vlm-ovis2.yaml --reserved`, `-dpo.yaml` and `-d4.yaml`, held out at 2 +
4 layers, 504 px, two images): full fine-tuning and LoRA, checkpointing on and off, one, two and four images; the image tokens, the visual tokenizer's saved tensors and the
reference's pass through it by hand; what is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.estimate.lora import lora_layout
from hpcmem.estimate.vision_llava import tower_terms
from hpcmem.job.shape import precision
from hpcmem.validate.cases import case_job
from tests.helpers.stored_cases import estimated_tensor_peak, stored_case_job, trace_records

ROOT = Path(__file__).resolve().parents[2]
RECORDS = trace_records(ROOT, "vlm-ovis2", "vlm-ovis2-dpo", "vlm-ovis2-d4")


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    traced = RECORDS[case_id]["traced"]
    estimated = estimated_tensor_peak(RECORDS[case_id], ROOT)
    assert abs(estimated - traced) <= 3 / 100 * traced, (estimated, traced)


def test_the_matrix_is_all_there():
    assert len(RECORDS) == 13 + 4 + 3


@pytest.mark.parametrize(("case_id", "patches", "tokens"), [("ovis448-full-nogc", 1024, 256),
                                                             ("ovis560-full-nogc", 1600, 400),
                                                             ("ovis448-4img-full-nogc", 4 * 1024, 4 * 256),
                                                             ("ovis-dpo-full-nogc-448", 2 * 1024, 2 * 256)])
def test_the_images_by_hand(case_id, patches, tokens):
    """Each image resized to the tower's square: (448 / 14)² = 1,024 patches, hidden_stride 2 → 16² = 256 tokens;
    (560 / 14)² = 1,600 → 20² = 400; DPO runs each image for chosen and rejected."""
    est = estimate(stored_case_job(RECORDS[case_id], ROOT))
    assert (est.extra["vision"]["patches_per_micro_batch"], est.extra["vision"]["image_tokens_per_micro_batch"]) == \
        (patches, tokens)


def test_the_visual_tokenizer_keeps_its_inputs_when_it_trains():
    """Full fine-tuning against LoRA on q_proj and v_proj (which reach no head) at 448 px, 256 image tokens, bf16
    under autocast: head_linear's input ([256, 4 · 1024] bf16), the table matmul's input ([256, 16384] bf16) and the
    last RMSNorm's weight-gradient tensors ([1024 patches, 1024] bf16 twice) only when they train; head_norm's fp32
    input and statistics and softmax's fp32 output either way."""
    full = stored_case_job(RECORDS["ovis448-full-gc"], ROOT)
    lora = stored_case_job(RECORDS["ovis448-full-gc"], ROOT, use_peft=True, lora_target_modules=["q_proj", "v_proj"])
    trained = tower_terms(full, precision(full), lora_layout(full)).merger_saved
    frozen = tower_terms(lora, precision(lora), lora_layout(lora)).merger_saved
    assert trained - frozen == 256 * 4096 * 2 + 256 * 16384 * 2 + 2 * 1024 * 1024 * 2
    assert frozen >= 256 * 16379 * (4 + 4) + 1024 * 1024 * 4


def test_the_reference_pass_through_the_visual_tokenizer():
    """DPO, LoRA without checkpointing at 560 px: 2 images, 3,200 patches, 800 image tokens. In head_norm under
    autocast: the tower's output ([3200, 1024] bf16), the concatenated copy ([800, 4096] bf16), head_linear's output
    ([800, 16379] bf16), head_norm's fp32 copy of it and its fp32 output."""
    est = estimate(stored_case_job(RECORDS["ovis-dpo-lora-all-nogc-560"], ROOT))
    phase = next(p for p in est.phases if p.name == "reference forward (vision connector)")
    live = next(c.bytes for c in phase.components if c.name == "vision connector (no grad)")
    assert live == 3200 * 1024 * 2 + 800 * 4096 * 2 + 800 * 16379 * (2 + 4 + 4)


def test_grpo_with_images_is_refused():
    with pytest.raises(SpecError, match="with trainer grpo on ovis2: hpcmem models ovis2's images for sft, dpo only"):
        stored_case_job(RECORDS["ovis448-full-gc"], ROOT, trainer="grpo")


def test_a_hard_visual_tokenizer_is_refused_for_images(tmp_path):
    """tokenize_function "st_argmax": Ovis2VisionModel.forward's hard_softmax (a one-hot scatter beside softmax)."""
    cfg = json.loads((ROOT / RECORDS["ovis448-full-gc"]["case"]["model_name_or_path"]).read_text())
    cfg["vision_config"]["tokenize_function"] = "st_argmax"
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(SpecError, match="tokenize_function 'st_argmax' with ovis2 images"):
        case_job({**RECORDS["ovis448-full-gc"]["case"], "model_name_or_path": str(path)})

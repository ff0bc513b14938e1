"""Gemma 4 SFT with images on a learned text part (tests/fixtures/vlm/gemma4-L2-D2.json: 2 Gemma 4 text layers, their
terms from hpcmem/profiles/gemma4_text-14efd03bf10c3bda.json; 2 vision layers) against the trace of TRL's SFTTrainer
with its vision collator and transformers' Gemma4Processor on blank 768×768 and 384×1536 images
(estimator/traces/vlm-gemma4.jsonl, written by `hpcmem validate trace --cases estimator/cases/vlm-gemma4.yaml`); an
encoder layer's and the pooler's and embedder's saved tensors by hand; what is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.estimate.lora import lora_layout
from hpcmem.estimate.vision_llava import tower_terms
from hpcmem.job.shape import precision
from hpcmem.validate.cases import case_job
from tests.helpers.stored_cases import assert_learned_case_holds, grpo_with_images_job, trace_records

ROOT = Path(__file__).resolve().parents[2]
RECORDS = trace_records(ROOT, "vlm-gemma4")
CUT = "tests/fixtures/vlm/gemma4-L2-D2.json"


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    assert_learned_case_holds(RECORDS[case_id], ROOT)


def test_the_matrix_is_all_there():
    assert len(RECORDS) == 10 + 2
    assert {(r["case"].get("image_height", 768), r["case"].get("image_width", 768)) for r in RECORDS.values()} == \
        {(768, 768), (384, 1536)}


def _job(**kw):
    return case_job({"trainer": "sft", "model_name_or_path": str(ROOT / CUT), "max_length": 1024,
                     "images_per_example": 1, "image_height": 768, "image_width": 768, "dtype": "bfloat16",
                     "bf16": True, "per_device_train_batch_size": 1, **kw})


def test_an_encoder_layer_keeps_by_hand():
    """Full fine-tuning without checkpointing, one 768×768 image: 2,520 padded patch rows of width 768, bf16.
    Per row: input_layernorm and pre_feedforward_layernorm (Gemma4RMSNorm, fp32 upcast and fp32 normalised tensor
    for the weight multiply, the bf16 output for the linears) 2 · (4 + 4 + 2) · 768, the two post-norms 2 · (4 + 4) ·
    768; q, k, v and SDPA's output 2 · 4 · 768 and the fp32 logsumexp 4 · 12; q_norm and k_norm over the heads
    (4 + 4) · 2 · 768; v_norm's fp32 upcast 4 · 768; act(gate), gate, up and their product 4 · 2 · 3072; o_proj's
    input copy 2 · 768. With padding (2,304 real patches), SDPA's additive bf16 bias [1, 1, 2520, 2520]."""
    job = _job(gradient_checkpointing=False)
    terms = tower_terms(job, precision(job), lora_layout(job))
    row = (2 * 10 + 2 * 8) * 768 + 2 * 4 * 768 + 4 * 12 + 8 * 2 * 768 + 4 * 768 + 8 * 3072 + 2 * 768
    assert terms.block_full == 2520 * row + 2 * 2520 ** 2
    assert terms.blocks_saved == (terms.block_full,) * 2


def test_the_pooler_and_embedder_keep_by_hand():
    """The pooler's matmul keeps its fp32 one-hot weights [1, 2520, 280] (the hidden states need no weight gradient);
    embed_vision on the 256 image tokens: the weightless RMSNorm's fp32 upcast and the projection's bf16 input."""
    job = _job(gradient_checkpointing=True)
    terms = tower_terms(job, precision(job), lora_layout(job))
    assert terms.merger_saved == 2520 * 280 * 4 + 256 * 768 * (4 + 2)


def test_lora_trains_the_adapters_only():
    """LoRA r16 all-linear: every layer's seven linears, input_proj (768 → 768) and embedding_projection (768 →
    2304); fp32 adapters and gradients (peft's autocast_adapter_dtype upcasts bf16 adapters)."""
    job = _job(use_peft=True, lora_target_modules=["all-linear"], gradient_checkpointing=True)
    terms = tower_terms(job, precision(job), lora_layout(job))
    per_layer = 16 * (4 * (768 + 768) + 2 * (768 + 3072) + (3072 + 768))
    trainable = 2 * per_layer + 16 * (768 + 768) + 16 * (768 + 2304)
    assert terms.gradients == trainable * 4


def test_grpo_with_images_is_refused():
    """DPO with images holds (the stored DPO traces above); GRPO and RLOO with images are not traced: refused."""
    with pytest.raises(SpecError, match="with trainer grpo on gemma4: hpcmem models gemma4's images for "
                                         "sft, dpo only"):
        estimate(grpo_with_images_job(ROOT / CUT, 768, 768))
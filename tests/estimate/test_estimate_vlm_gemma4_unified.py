"""Gemma 4 unified SFT with images on a learned text part (tests/fixtures/vlm/gemma4-unified-L2.json: 2 text layers,
their terms from hpcmem/profiles/gemma4_unified_text-f77defef3b566d78.json; no encoder, the embedder over 280 padded
rows per image) against the trace of TRL's SFTTrainer with its vision collator and transformers'
Gemma4UnifiedProcessor on blank 768×768 and 384×1536 images (estimator/traces/vlm-gemma4-unified.jsonl, written by
`hpcmem validate trace --cases estimator/cases/vlm-gemma4-unified.yaml`); the embedder's saved tensors by hand, as
modular_gemma4_unified.py `Gemma4UnifiedVisionEmbedder.forward` runs; what is refused."""

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
RECORDS = trace_records(ROOT, "vlm-gemma4-unified")
CUT = "tests/fixtures/vlm/gemma4-unified-L2.json"


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    assert_learned_case_holds(RECORDS[case_id], ROOT)


def test_the_matrix_is_all_there():
    assert len(RECORDS) == 8 + 2
    assert {(r["case"].get("image_height", 768), r["case"].get("image_width", 768)) for r in RECORDS.values()} == \
        {(768, 768), (384, 1536)}


def _job(**kw):
    return case_job({"trainer": "sft", "model_name_or_path": str(ROOT / CUT), "max_length": 1024,
                     "images_per_example": 1, "image_height": 768, "image_width": 768, "dtype": "bfloat16",
                     "bf16": True, "per_device_train_batch_size": 1, **kw})


def test_the_embedder_keeps_by_hand_full():
    """Full fine-tuning, one 768×768 image: 280 rows, bf16 weights under autocast. Per row: patch_ln1 its fp32 input
    over 6,912, mean and rstd (8) and its output cast for patch_dense 2 · 6,912; patch_ln2 and pos_norm their fp32
    inputs over 3,840 and stats; the position lookup's int64 x/y index and the bf16 validity mask; the weightless
    RMSNorm's fp32 tensor 4 · 3,840, the projection's bf16 input 2 · 3,840 and the padding mask's byte. Alive in the
    forward only: pos_norm's fp32 output (last_hidden_state) and the 256 image rows of width 2,304 twice (the
    indexed pooler_output and torch.cat's copy)."""
    job = _job(gradient_checkpointing=False)
    terms = tower_terms(job, precision(job), lora_layout(job))
    row = (4 * 6912 + 8 + 2 * 6912) + 2 * (4 * 3840 + 8) + (2 * 8 + 2 * 2) + (4 * 3840 + 2 * 3840 + 1)
    assert terms.saved == terms.merger_saved == 280 * row
    assert terms.forward_only == 280 * 3840 * 4 + 2 * 256 * 2304 * 2
    assert terms.blocks_saved == () and terms.pixels == 280 * 6912 * 4


def test_lora_trains_the_two_adapters_only():
    """LoRA r16 all-linear: patch_dense (6,912 → 3,840) and embedding_projection (3,840 → 2,304); fp32 adapters and
    gradients (peft's autocast_adapter_dtype upcasts bf16 adapters); patch_dense's adapter keeps no dropout mask (its
    input needs no gradient), embedding_projection's keeps one."""
    job = _job(use_peft=True, lora_target_modules=["all-linear"], gradient_checkpointing=False)
    terms = tower_terms(job, precision(job), lora_layout(job))
    assert terms.gradients == 16 * (6912 + 3840 + 3840 + 2304) * 4
    row = (6912 * 2 + 16 * 2) + (3840 * (1 + 2) + 16 * 2) + 2 * (4 * 3840 + 8) + 2 * 8 + (4 * 3840 + 1)
    assert terms.saved == 280 * row


def test_the_same_padded_rows_at_both_sizes():
    """Every image is padded to 280 rows: the embedder's saved tensors do not depend on the image's size."""
    a, b = _job(gradient_checkpointing=True), _job(gradient_checkpointing=True, image_height=384, image_width=1536)
    ta, tb = (tower_terms(j, precision(j), lora_layout(j)) for j in (a, b))
    assert ta.saved == tb.saved and (ta.image_tokens, tb.image_tokens) == (256, 264)


def test_grpo_with_images_is_refused():
    """DPO with images holds (the stored DPO traces above); GRPO and RLOO with images are not traced: refused."""
    with pytest.raises(SpecError, match="with trainer grpo on gemma4_unified: hpcmem models gemma4_unified's images for "
                                         "sft, dpo only"):
        estimate(grpo_with_images_job(ROOT / CUT, 768, 768))
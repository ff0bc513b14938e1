"""GLM-4.1V SFT with images (tests/fixtures/vlm/glm4v-9b-width-L2-D2.json: GLM-4.1V-9B's widths cut to 2 text layers
and 2 vision blocks) against the trace of TRL's SFTTrainer with its vision collator and transformers' Glm4vProcessor
on blank 448×448 and 640×480 images (estimator/traces/vlm-glm4v.jsonl, written by `hpcmem validate trace --cases
estimator/cases/vlm-glm4v.yaml`); the tower's terms outside its blocks by hand; what is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.estimate.lora import lora_layout
from hpcmem.estimate.vision_llava import tower_terms
from hpcmem.job.shape import precision
from hpcmem.validate.cases import case_job
from tests.helpers.stored_cases import estimated_tensor_peak, grpo_with_images_job, trace_records

ROOT = Path(__file__).resolve().parents[2]
RECORDS = trace_records(ROOT, "vlm-glm4v")
CUT = "tests/fixtures/vlm/glm4v-9b-width-L2-D2.json"


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    record = RECORDS[case_id]
    assert abs(estimated_tensor_peak(record, ROOT) - record["traced"]) <= 0.03 * record["traced"]


def test_the_matrix_is_all_there():
    assert len(RECORDS) == 8 + 2
    assert {(r["case"].get("image_height", 448), r["case"].get("image_width", 448)) for r in RECORDS.values()} == \
        {(448, 448), (480, 640)}


def _job(**kw):
    return case_job({"trainer": "sft", "model_name_or_path": str(ROOT / CUT), "max_length": 1024,
                     "images_per_example": 1, "image_height": 448, "image_width": 448, "dtype": "bfloat16",
                     "bf16": True, "per_device_train_batch_size": 1, **kw})


def test_the_parts_after_the_blocks_keep_by_hand():
    """Full fine-tuning, bf16 under autocast, 448×448 → 1024 patch rows, 256 merged rows (modeling_glm4v.py
    Glm4vVisionModel.forward). post_layernorm (Glm4vRMSNorm over 1536, its weight trained) keeps its fp32 input and
    the normalised tensor cast back and its input: 4 + 2 + 2 bytes a value; the downsample Conv2d keeps its input,
    the permuted view of post_layernorm's bf16 output: 2 bytes. Glm4vVisionPatchMerger on 256 rows of 4096: proj's bf16
    input (2), post_projection_norm's fp32 input and mean/rstd (4 a value + 8 a row), GELU's fp32 input (4), the
    bf16 cast gate/up_proj read (2); the gated MLP at 13696: gate's output, SiLU's, up's and the product, bf16."""
    job = _job(gradient_checkpointing=True)
    terms = tower_terms(job, precision(job), lora_layout(job))
    assert terms.patches == 1024 and terms.image_tokens == 256
    assert terms.merger_saved == 1024 * (8 + 2) * 1536 + 256 * (12 * 4096 + 8) + 256 * 4 * 13696 * 2


def test_lora_keeps_no_weight_inputs_outside_the_blocks():
    """LoRA all-linear: nothing before the first block requires grad (Glm4vVisionModel hooks no input embeddings), so
    before the blocks are the rotary tables (fp32 [N, 128] twice) and, under checkpointing, the token embeddings'
    [1024, 4096] bf16 output that enable_input_require_grads makes a leaf."""
    job = _job(gradient_checkpointing=True, use_peft=True, lora_target_modules="all-linear")
    terms = tower_terms(job, precision(job), lora_layout(job))
    before = terms.saved - sum(terms.blocks_saved) - terms.merger_saved
    assert before == 2 * 1024 * 128 * 4 + 1024 * 4096 * 2


def test_grpo_with_images_is_refused():
    """DPO with images holds (the stored DPO traces above); GRPO and RLOO with images are not traced: refused."""
    with pytest.raises(SpecError, match="with trainer grpo on glm4v: hpcmem models glm4v's images for "
                                         "sft, dpo only"):
        estimate(grpo_with_images_job(ROOT / CUT, 448, 448))
"""DeepSeek-VL SFT and DPO with images (DeepSeek-VL 1.3B's widths cut to 1 decoder layer and 4 SigLIP layers, 384 and
512 px) against the trace of TRL's SFTTrainer / DPOTrainer with their vision collators, transformers'
DeepseekVLProcessor and DeepseekVLImageProcessorPil on real 480×640 images (estimator/traces/vlm-deepseek-vl*.jsonl,
written by `hpcmem validate trace --cases estimator/cases/vlm-deepseek-vl.yaml`, `-dpo.yaml`, and `-1.3b.yaml` held
out at full depth): full fine-tuning and LoRA all-linear, checkpointing on and off; the batch by hand; what is
refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.estimate.lora import lora_layout
from hpcmem.estimate.vision import ACTIVATIONS
from hpcmem.estimate.vision_llava import tower_terms
from hpcmem.job.shape import precision
from hpcmem.validate.cases import case_job
from tests.helpers.stored_cases import estimated_tensor_peak, largest_component, stored_case_job, trace_records

ROOT = Path(__file__).resolve().parents[2]
RECORDS = trace_records(ROOT, "vlm-deepseek-vl", "vlm-deepseek-vl-dpo", "vlm-deepseek-vl-1.3b")


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    traced = RECORDS[case_id]["traced"]
    estimated = estimated_tensor_peak(RECORDS[case_id], ROOT)
    assert abs(estimated - traced) <= 3 / 100 * traced, (estimated, traced)


def test_the_matrix_is_all_there():
    assert len(RECORDS) == 8 + 4 + 4


@pytest.mark.parametrize(("case_id", "images"), [("dsvl384-full-nogc", 1), ("dsvl-dpo-full-nogc-384", 2)])
def test_the_images_by_hand(case_id, images):
    """One 480×640 image per row resized and padded to 384 px: (384 / 16)² = 576 patches and tokens; DPO runs each
    image for chosen and rejected. A tower no adapter reaches without checkpointing keeps only pixel_values,
    3 · 384² fp32 bytes per image."""
    job = stored_case_job(RECORDS[case_id], ROOT, use_peft=True, lora_target_modules=["gate_proj", "up_proj"],
                          gradient_checkpointing=False)
    est = estimate(job)
    assert (est.extra["vision"]["patches_per_micro_batch"], est.extra["vision"]["image_tokens_per_micro_batch"]) == \
        (images * 576, images * 576)
    assert largest_component(est, ACTIVATIONS) >= images * 3 * 384 * 384 * 4
    assert any(c.bytes == images * 3 * 384 * 384 * 4 for p in est.phases for c in p.components
               if c.name == ACTIVATIONS)


def test_the_aligner_keeps_gelus_input_and_linear2s_input_when_it_trains():
    """Full fine-tuning against LoRA on q_proj and v_proj, at 512 px (1,024 image tokens): the aligner's linear1 output
    (GELU's input, [1024, 2048] bf16) is kept either way; post_layernorm's output (linear1's input, [1024, 1024] bf16)
    and GELU's output (linear2's input, [1024, 2048] bf16) only when linear1 and linear2 train."""
    full = stored_case_job(RECORDS["dsvl512-full-gc"], ROOT)
    lora = stored_case_job(RECORDS["dsvl512-full-gc"], ROOT, use_peft=True, lora_target_modules=["q_proj", "v_proj"])
    trained = tower_terms(full, precision(full), lora_layout(full)).merger_saved
    frozen = tower_terms(lora, precision(lora), lora_layout(lora)).merger_saved
    assert trained - frozen == 1024 * 1024 * 2 + 1024 * 2048 * 2


def test_grpo_with_images_is_refused():
    with pytest.raises(SpecError, match="with trainer grpo on deepseek_vl: hpcmem models deepseek_vl's images for "
                                        "sft, dpo only"):
        stored_case_job(RECORDS["dsvl384-full-gc"], ROOT, trainer="grpo")


def test_a_tower_with_its_pooling_head_is_refused_for_images(tmp_path):
    """A vision_config that omits vision_use_head takes SiglipVisionConfig's True: the head runs on every image."""
    cfg = json.loads((ROOT / RECORDS["dsvl384-full-gc"]["case"]["model_name_or_path"]).read_text())
    del cfg["vision_config"]["vision_use_head"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(SpecError, match="vision_use_head true with deepseek_vl images"):
        case_job({**RECORDS["dsvl384-full-gc"]["case"], "model_name_or_path": str(path)})


def test_the_reference_forward_tiles_only_the_completions():
    """DPO, LoRA without checkpointing at 512 px: chosen + rejected, 2 rows × 1,536 tokens, each prompt 1,024 image
    tokens and a word. The reference pass through the adapter-disabled policy holds the hidden state in and out
    (2 · 3,072 · 2,048 bf16), the widest of one layer's MLP intermediates (3 · 3,072 · 5,632 bf16) and the fused
    head's tile — TRL's head tiles only the 2 × (1,536 − 1 − 1,024) = 1,022 labelled positions (1,022 · 32,768 bf16,
    smaller than the MLP's; over all 3,072 tokens it would be 3,072 · 32,768 bf16, larger) — and 3 fp32 statistics
    per token."""
    est = estimate(stored_case_job(RECORDS["dsvl-dpo-lora-all-nogc-512"], ROOT))
    ref = next(p for p in est.phases if p.name == "reference forward")
    no_grad = next(c.bytes for c in ref.components if c.name == "no-grad pass")
    mlp, tile = 3 * 3072 * 5632 * 2, 1022 * 32768 * 2
    assert tile < mlp < 3072 * 32768 * 2
    assert no_grad == 2 * 3072 * 2048 * 2 + mlp + 3072 * 3 * 4

"""ERNIE-4.5-VL SFT with images on a learned text part (tests/fixtures/vlm/ernie4-5-vl-moe-defaults-L2-D2.json: two
ernie4_5_vl_moe_text layers of the text config class's widths — one dense, one with text and vision experts — their
terms from the learned profile in hpcmem/profiles/; Ernie4_5_VLMoeVisionConfig's tower cut to 2 blocks under the
resampler) against the trace of TRL's SFTTrainer with its vision collator and transformers' Ernie4_5_VLMoeProcessor on
blank 448×448 and 896×672 images (estimator/traces/vlm-ernie4-5-vl-moe.jsonl, written by `hpcmem validate trace
--cases estimator/cases/vlm-ernie4-5-vl-moe.yaml --reserved --workers 1`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate import estimate
from hpcmem.estimate.lora import LoraLayout
from hpcmem.estimate.vision_ernie4_5_vl_moe import resampler_saved, routing_saved
from hpcmem.job.shape import Precision
from hpcmem.validate.cases import case_job
from tests.helpers.stored_cases import assert_learned_case_holds, grpo_with_images_job, trace_records

ROOT = Path(__file__).resolve().parents[2]
RECORDS = trace_records(ROOT, "vlm-ernie4-5-vl-moe")
CUT = "tests/fixtures/vlm/ernie4-5-vl-moe-defaults-L2-D2.json"
PREC = Precision(weight=2, act=2, residual=2, autocast=False, amp=True)


def _job(**case):
    return case_job({"trainer": "sft", "model_name_or_path": str(ROOT / CUT), "max_length": 1536,
                     "images_per_example": 1, "image_height": 672, "image_width": 896, "dtype": "bfloat16",
                     "bf16": True, "per_device_train_batch_size": 1, "gradient_checkpointing": False, **case})


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    assert_learned_case_holds(RECORDS[case_id], ROOT)


def test_the_matrix_is_all_there():
    assert len(RECORDS) == 12
    assert {(r["case"]["images_per_example"], r["case"]["image_height"], r["case"]["image_width"])
            for r in RECORDS.values()} == {(1, 448, 448), (1, 672, 896), (2, 448, 448)}
    assert {r["cell"] for r in RECORDS.values()} == {f"sft/{c}" for c in ("full+gc", "full+nogc", "lora+gc",
                                                                          "lora+nogc")}


def test_the_image_tokens_routing_by_hand():
    """One 896 × 672 image in a 1,536-token row: 768 image tokens and its start and end markers (770) go to the
    vision experts of the cut's one sparse layer. Each takes 6 experts; per (token, expert) the experts keep the
    gate_up output (2 · I), silu's output (I) and, trained, down_proj's input (I): 4 · I · 2 bytes trained, 3 · I · 2
    frozen, I = 512 instead of the text experts' 1536. The two `~token_type_ids_states` masks: 2 · 1536 · 2560 bytes;
    the router's mask under the load-balancing loss (router_aux_loss_coef 0.001): 1536 · 64 bytes."""
    job = _job()
    v = job.model.vision
    masks = 2 * 1536 * 2560 + 1536 * 64
    assert routing_saved(job, v, 1, 768, PREC, trained=True) == masks + 770 * 6 * 4 * 2 * (512 - 1536)
    assert routing_saved(job, v, 1, 768, PREC, trained=False) == masks + 770 * 6 * 3 * 2 * (512 - 1536)
    assert routing_saved(_job(router_aux_loss_coef=0.0), v, 1, 768, PREC, trained=True) == \
        2 * 1536 * 2560 + 770 * 6 * 4 * 2 * (512 - 1536)
    # under checkpointing a decoder layer keeps its input alone: nothing beyond the learned terms
    assert routing_saved(_job(gradient_checkpointing=True), v, 1, 768, PREC, trained=True) == 0


def test_the_resampler_by_hand():
    """3,072 patches → 768 rows of the resampler. Frozen: `ln`'s fp32 input and statistics over the patches, the two
    GELU inputs [768, 5120] bf16, the two LayerNorms' fp32 inputs and statistics, after_norm's fp32 upcast [768, 2560].
    Trained besides: `ln`'s bf16 output (spatial fc1's input), the two fc2 inputs, temporal fc1's bf16 input [768,
    10240], the temporal LayerNorm's bf16 output (mlp's input), after_norm's bf16 normalised tensor."""
    v, n, rows = _job().model.vision, 3072, 768
    off = LoraLayout(enabled=False)
    frozen = ((4 * 1280 + 8) * n + 2 * 2 * 5120 * rows + 2 * (4 * 5120 + 8) * rows + 4 * 2560 * rows)
    trained = frozen + 2 * 1280 * n + 2 * 2 * 5120 * rows + 2 * 10240 * rows + 2 * 5120 * rows + 2 * 2560 * rows
    assert resampler_saved(v, n, PREC, trained=False, adapted=[], lora=off) == frozen
    assert resampler_saved(v, n, PREC, trained=True, adapted=[], lora=off) == trained


def test_grpo_and_dpo_with_images_are_refused():
    """SFT with images holds (the stored traces above); GRPO and RLOO with images are not traced, DPO raises in the
    real model (below): refused."""
    with pytest.raises(SpecError, match="with trainer grpo on ernie4_5_vl_moe"):
        estimate(grpo_with_images_job(ROOT / CUT, 448, 448))
    with pytest.raises(SpecError, match="moe_mm_token_type_ids unextended"):
        estimate(_job(trainer="dpo"))


@pytest.mark.torch
def test_dpo_s_image_collator_makes_a_batch_the_real_model_raises_on():
    """TRL 1.16's DataCollatorForVisionPreference on one row (an image in the prompt) with the trace's
    Ernie4_5_VLMoeProcessor: input_ids run over prompt and completion, moe_mm_token_type_ids over the prompt only; the
    real model (a small Ernie4_5_VLMoeConfig: head_dim 128 as the text rotary's mrope_section [22, 22, 20] needs)
    raises in Ernie4_5_VLMoeMoeBlock.forward on that batch."""
    pytest.importorskip("torch")
    pytest.importorskip("trl")
    from PIL import Image
    from transformers import Ernie4_5_VLMoeConfig, Ernie4_5_VLMoeForConditionalGeneration
    from trl.trainer.dpo_trainer import DataCollatorForVisionPreference

    from hpcmem.trace.vision import processor, token_ids

    job = _job(image_height=112, image_width=112)
    proc = processor(job)
    row = {"images": [Image.new("RGB", (112, 112))],
           "prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "w w w"}]}],
           "chosen": [{"role": "assistant", "content": [{"type": "text", "text": "w w"}]}],
           "rejected": [{"role": "assistant", "content": [{"type": "text", "text": "w w w w"}]}]}
    batch = DataCollatorForVisionPreference(processor=proc)([row])
    assert batch["moe_mm_token_type_ids"].shape[1] < batch["input_ids"].shape[1]
    config = Ernie4_5_VLMoeConfig(
        text_config={"num_hidden_layers": 2, "hidden_size": 256, "intermediate_size": 64, "num_attention_heads": 2,
                     "num_key_value_heads": 1, "vocab_size": len(proc.tokenizer) + 8, "moe_num_experts": 4,
                     "moe_k": 2, "moe_intermediate_size": [32, 16], "moe_num_shared_experts": 1},
        vision_config={"depth": 1, "hidden_size": 64, "intermediate_size": 64, "num_heads": 2}, **token_ids(proc))
    model = Ernie4_5_VLMoeForConditionalGeneration(config)
    with pytest.raises(IndexError, match="shape of the mask"):
        model(**{k: v for k, v in batch.items() if k != "completion_mask"}, use_cache=False)


def test_full_fine_tuning_without_images_is_refused():
    """Without images no token reaches the vision experts: they get no gradient and no AdamW state, which the learned
    text part counts (traced on the cut, text only, full fine-tuning without checkpointing at 1,536 tokens: estimate
    11,783 MiB, trace 10,267 MiB: 1,516 MiB over, of which the 251.7 M vision-expert parameters' gradients and AdamW
    states, 2 + 4 bytes each, are 1,440 MiB); LoRA keeps them frozen either way and is estimated."""
    with pytest.raises(SpecError, match="vision experts get no gradient"):
        estimate(_job(images_per_example=0))
    assert estimate(_job(images_per_example=0, use_peft=True, lora_target_modules="all-linear")).peak_allocated_bytes

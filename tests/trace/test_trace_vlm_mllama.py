"""Llama-3.2-11B-Vision on the real trainer: TRL 1.16's SFTTrainer with its vision collator and transformers'
MllamaProcessor takes an mllama model with images and trains it on CPU (a tiny config, one step), peft's all-linear
adapting the vision tower, the projector and the cross-attention layers; and its trace on fake tensors at full width
(estimator/cases/vlm-mllama.yaml, full fine-tuning without checkpointing) agrees with the estimate within 3 %."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("trl")

from tests.helpers.trace_helpers import shipped_case_job  # noqa: E402

pytestmark = pytest.mark.torch
MAX_PCT = 3.0


def _job(case_id: str):
    return shipped_case_job("vlm-mllama.yaml", case_id)


def test_full_fine_tuning_agrees_with_the_estimate():
    from hpcmem.estimate import estimate
    from hpcmem.estimate.workspaces import tensor_bytes
    from hpcmem.trace.run import run_trace

    job = _job("mllama-full-nogc-1tile")
    traced = run_trace(job).peak_allocated_bytes
    estimated = max(tensor_bytes(p) for p in estimate(job).phases)
    assert abs(estimated - traced) <= MAX_PCT / 100 * traced, (estimated, traced)


def test_the_real_trainer_trains_mllama_with_images(tmp_path):
    """One CPU step of LoRA all-linear under checkpointing on a tiny mllama (28-px tiles) with a 28×56 image (1 × 2
    tiles, padded to 4): the batch carries pixel_values [rows, 1, 4, 3, 28, 28], aspect_ratio_ids/mask and the
    cross-attention mask, and peft adapts the tower's q/k/v/o_proj, fc1, fc2 and multi_modal_projector besides the
    decoder's linears (cross_attn's q/k/v/o_proj too)."""
    import transformers
    from datasets import Dataset
    from peft import LoraConfig
    from PIL import Image
    from trl import SFTConfig, SFTTrainer

    from hpcmem.trace import vision_mllama
    from hpcmem.trace.pieces import WORD

    proc = vision_mllama.processor(SimpleNamespace(model=SimpleNamespace(
        vision=SimpleNamespace(image_size=28, max_num_tiles=4))))
    cfg = transformers.AutoConfig.for_model(
        "mllama", image_token_index=proc.tokenizer.convert_tokens_to_ids(vision_mllama.IMAGE),
        text_config={"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                     "vocab_size": len(proc.tokenizer), "intermediate_size": 64, "cross_attention_layers": [1],
                     "pad_token_id": 0},
        vision_config={"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2, "num_global_layers": 1,
                       "attention_heads": 2, "image_size": 28, "patch_size": 14, "vision_output_dim": 32,
                       "intermediate_layers_indices": [0]})
    model = transformers.MllamaForConditionalGeneration(cfg)
    rows = [[{"role": "user", "content": " ".join([WORD] * 10)}, {"role": "assistant", "content": WORD}]] * 2
    data = Dataset.from_dict({"images": [[Image.new("RGB", (56, 28))]] * 2, "messages": rows})
    args = SFTConfig(output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=2, max_length=32, bf16=False,
                     gradient_checkpointing=True, report_to=[], save_strategy="no", use_cpu=True)
    trainer = SFTTrainer(model=model, args=args, train_dataset=data, processing_class=proc,
                         peft_config=LoraConfig(r=4, target_modules="all-linear"))
    batch = next(iter(trainer.get_train_dataloader()))
    assert tuple(batch["pixel_values"].shape) == (2, 1, 4, 3, 28, 28)
    assert {"aspect_ratio_ids", "aspect_ratio_mask", "cross_attention_mask"} <= set(batch)
    adapted = {n.split(".lora_A")[0] for n, p in trainer.model.named_parameters() if p.requires_grad and ".lora_A" in n}
    tower = {a.rsplit("layers.0.", 1)[1] for a in adapted if ".vision_model.transformer.layers.0." in a}
    assert tower == {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.fc1",
                     "mlp.fc2"}
    assert any(a.endswith("multi_modal_projector") for a in adapted)
    assert {a.rsplit(".", 1)[1] for a in adapted if ".cross_attn." in a} == {"q_proj", "k_proj", "v_proj", "o_proj"}
    assert trainer.train().training_loss > 0

"""A generating trainer pads its whole generation batch as one (prompts left, completions right, to the longest:
trl/trainer/distillation_trainer.py and grpo_trainer.py `_generate_and_score_completions`) and only then splits it
into micro-batches (`_prepare_inputs`: split_tensor_dict), so a micro-batch of one row still carries padding when the
generation batch held more rows: transformers then builds the 4-D boolean mask [rows, 1, seq, seq] and SDPA keeps the
additive bias it makes from it. Without other rows there is nothing to pad to."""

from __future__ import annotations

from hpcmem.estimate.activations import mask_bytes
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import micro_batch
from hpcmem.job.spec import TrainSpec
from hpcmem.models.spec import ModelSpec

MODEL = ModelSpec(name="tiny-llama", model_type="llama", vocab_size=1000, hidden_size=128, intermediate_size=256,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                  tie_word_embeddings=False)


def job(trainer: str, **train) -> JobSpec:
    extra = {"teacher_model_name_or_path": "tiny-llama"} if trainer == "distillation" else {}
    return JobSpec(model=MODEL, teacher=MODEL if trainer == "distillation" else None, train=TrainSpec(
        trainer=trainer, max_prompt_length=100, max_completion_length=28, per_device_train_batch_size=1,
        **extra, **train))


def test_one_row_cut_from_a_padded_generation_batch_is_masked():
    # distillation generates per_device_train_batch_size × gradient_accumulation_steps rows at once
    mb = micro_batch(job("distillation", gradient_accumulation_steps=2))
    assert mb.rows == 1 and mb.masked
    assert mask_bytes(mb) == 128 * 128          # one row's [1, 1, 128, 128] bool mask
    # GRPO: per_device_train_batch_size × steps_per_generation rows (num_generations of them per prompt)
    assert micro_batch(job("grpo", gradient_accumulation_steps=2, num_generations=2)).masked


def test_a_lone_generated_row_has_nothing_to_pad_to():
    mb = micro_batch(job("distillation", gradient_accumulation_steps=1))
    assert mb.rows == 1 and not mb.masked and mask_bytes(mb) == 0

"""ModelConfig's lora_task_type, read as peft reads it (hpcmem.job.lora_task_rules).

Known answers come from the real code, not from hpcmem: TRL's trainer run from the job's settings on a tiny Llama
(hpcmem.validate.trl_run, one CPU step), and peft's own `get_peft_model` on a tiny sequence-classification model for
which parameters train. TRL's refusals themselves (a reward model's LoRA with TRL's default CAUSAL_LM, SEQ_2_SEQ_LM, a
misspelt task type) are held in tests/job/test_trl_rejections.py beside every other refusal.
"""

from __future__ import annotations

import pytest

from hpcmem.errors import SpecError
from hpcmem.gpus.lookup import gpu_spec
from hpcmem.job.trl_config import build_job
from hpcmem.launch.trl_yaml import trl_config
from hpcmem.plan import apply, plan

SMALL = "Qwen/Qwen2.5-0.5B"
TINY = {"model_type": "llama", "vocab_size": 128, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256}
TINY_RUN = {"dtype": "float32", "bf16": False, "per_device_train_batch_size": 2, "max_length": 32, "lora_r": 8,
            "lora_alpha": 16}


def refusal(trainer: str, **settings) -> str | None:
    try:
        build_job(trainer, {"model_name_or_path": SMALL, **settings})
    except SpecError as exc:
        return str(exc)
    return None


def test_a_reward_model_with_seq_cls_is_estimated_and_the_default_is_refused_with_the_fix():
    assert refusal("reward", use_peft=True, lora_task_type="SEQ_CLS") is None
    why = refusal("reward", use_peft=True)
    assert why is not None and "lora_task_type CAUSAL_LM" in why and "set lora_task_type SEQ_CLS" in why
    assert len(why.strip().splitlines()) <= 2          # the field, the value and the rule, on one line after the header


def test_without_use_peft_the_field_is_never_read():
    assert refusal("reward", lora_task_type="anything") is None
    assert refusal("sft", lora_task_type="SEQ_CLS") is None


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.parametrize("trainer, settings", [
    ("reward", {"use_peft": True, "lora_task_type": "QUESTION_ANS"}),
    ("reward", {"use_peft": True, "lora_task_type": "FEATURE_EXTRACTION"}),
    ("sft", {"use_peft": True, "lora_task_type": "SEQ_CLS"}),
    ("reward", {"lora_task_type": "not-a-task-type"}),              # use_peft off: TRL never builds a LoraConfig
])
def test_what_trl_runs_is_either_estimated_or_refused_as_unmodelled_never_as_trls_failure(trainer, settings):
    from hpcmem.validate.trl_run import run_trl

    verdict = run_trl(trainer, {**TINY_RUN, **settings}, TINY, steps=1)
    assert verdict.ran is True, verdict.reason
    why = refusal(trainer, **settings)
    if why is not None:
        assert "does not model" in why or "has not traced" in why, why
        assert "raises" not in why, why


@pytest.mark.torch
def test_peft_trains_a_reward_models_score_head_under_seq_cls_only():
    """What the estimate counts for a reward model's LoRA (a trainable copy of `score` beside the adapters) and why
    QUESTION_ANS / FEATURE_EXTRACTION are not the same job: peft's own wrapping of a sequence-classification model."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForSequenceClassification

    def score_trains(task: str) -> bool:
        model = LlamaForSequenceClassification(LlamaConfig(**{k: v for k, v in TINY.items() if k != "model_type"},
                                                           num_labels=1))
        peft_model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type=task))
        return any(p.requires_grad for n, p in peft_model.named_parameters() if "score" in n)

    assert score_trains("SEQ_CLS") and score_trains("TOKEN_CLS")
    assert not score_trains("FEATURE_EXTRACTION") and not score_trains("QUESTION_ANS")


def test_a_plan_that_turns_lora_on_for_a_reward_model_writes_seq_cls():
    job, _ = build_job("reward", {"model_name_or_path": "meta-llama/Llama-3.1-8B", "max_length": 1024})
    plans = plan(job, gpu_spec("L4"), allow_peft=True)
    lora = [p for p in plans if p.knobs.peft in ("lora", "qlora")]
    assert lora, "an 8B reward model on a 24 GB GPU fits only with adapters"
    planned = apply(job, lora[0].knobs)
    assert planned.train.lora_task_type == "SEQ_CLS"
    assert trl_config(planned, {}, output_dir="out")["lora_task_type"] == "SEQ_CLS"

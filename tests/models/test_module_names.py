"""`lora_modules_to_save` names read as peft reads them: a name reaches the modules whose path ends with it, and none
where no path does (hpcmem.models.module_names). RWKV's vocabulary head is `head`, so `lm_head` there copies nothing:
the estimate had counted a trainable [V, H] copy with its gradient and Adam states, +20.4 % over the trace (random seed
4 job 17, RLOO with DoRA).

Oracles: transformers' own models built on the meta device (their module paths), real peft on a tiny RWKV on the
CPU (which modules it wraps), and the trace of the random job."""

from __future__ import annotations

import pytest

from hpcmem.models.module_names import INPUT_EMBEDDING, OUTPUT_HEAD, PREDICTION_HEAD, SCORE_HEAD, reaches


def test_reaches_reads_the_tables() -> None:
    assert reaches("llama", "lm_head") == "lm_head" and reaches("llama", "embed_tokens") == "embed_tokens"
    assert reaches("rwkv", "lm_head") is None and reaches("gpt2", "embed_tokens") is None
    assert reaches("modernbert-decoder", "lm_head") == "prediction head"
    assert reaches("ctrl", "score") is None and reaches("gpt2", "score") == "score"


def _meta_model(model_type: str, cls_name: str = "AutoModelForCausalLM"):
    import torch
    import transformers

    from hpcmem.validate.coverage import reference_config

    cfg, _ = reference_config(model_type)
    extra = {"num_labels": 1} if cls_name == "AutoModelForSequenceClassification" else {}
    with torch.device("meta"):
        return getattr(transformers, cls_name).from_config(transformers.AutoConfig.for_model(**{**cfg, **extra}))


def _path(model, module) -> str:
    return next(n for n, m in model.named_modules() if m is module)


@pytest.mark.torch
@pytest.mark.parametrize("model_type", sorted({*OUTPUT_HEAD, *INPUT_EMBEDDING, *PREDICTION_HEAD}) + ["llama"])
def test_the_tables_are_the_models_own_paths(model_type: str) -> None:
    model = _meta_model(model_type)
    paths = [n for n, _ in model.named_modules()]
    head, embedding = _path(model, model.get_output_embeddings()), _path(model, model.get_input_embeddings())
    assert head == OUTPUT_HEAD.get(model_type, "decoder" if model_type in PREDICTION_HEAD else "lm_head")
    assert any(p.endswith("lm_head") for p in paths) is (reaches(model_type, "lm_head") is not None)
    assert embedding == INPUT_EMBEDDING.get(model_type, embedding)
    assert any(p.endswith("embed_tokens") for p in paths) is (reaches(model_type, "embed_tokens") is not None)


@pytest.mark.torch
@pytest.mark.parametrize("model_type", sorted(SCORE_HEAD) + ["gpt2"])
def test_the_reward_heads_are_the_models_own(model_type: str) -> None:
    paths = [n for n, _ in _meta_model(model_type, "AutoModelForSequenceClassification").named_modules()]
    assert any(p.endswith("score") for p in paths) is (reaches(model_type, "score") is not None)


@pytest.mark.torch
def test_peft_copies_nothing_for_lm_head_on_rwkv() -> None:
    """A 2-layer RWKV at hidden 64: peft wraps no module for modules_to_save lm_head (and would for head)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from peft.utils.other import ModulesToSaveWrapper
    from transformers import RwkvConfig, RwkvForCausalLM

    def wrapped(names: list[str]) -> list[str]:
        torch.manual_seed(0)
        model = RwkvForCausalLM(RwkvConfig(vocab_size=128, hidden_size=64, num_hidden_layers=2,
                                           attention_hidden_size=64, intermediate_size=128))
        peft = get_peft_model(model, LoraConfig(r=4, target_modules=["key", "value"], modules_to_save=names))
        return [n for n, m in peft.named_modules() if isinstance(m, ModulesToSaveWrapper)]

    assert wrapped(["lm_head"]) == []
    assert [n.rsplit(".", 1)[-1] for n in wrapped(["head"])] == ["head"]


@pytest.mark.torch
def test_the_rwkv_job_counts_no_copy_and_says_why() -> None:
    from tests.helpers.random_records import allocated_error_pct, record_spec, scored_estimate, stored_trace_record

    rec = stored_trace_record("s4-17")
    spec = record_spec(rec)
    assert spec.train.lora_modules_to_save == ("lm_head",) and spec.model.model_type == "rwkv"
    assert abs(allocated_error_pct(spec, rec)) < 1.0
    warnings = scored_estimate(spec).warnings
    assert any("lora_modules_to_save lm_head: no module of rwkv" in w and "`head`" in w for w in warnings)
    assert not any("modules to save" in w and "not held" in w for w in warnings)

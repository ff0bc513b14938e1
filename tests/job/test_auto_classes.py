"""Refusals the real libraries make for a model type, held to them: the shipped sequence-classification list is the
installed transformers', and a reward job on a type without such a class, or LoRA on a Mamba block's out_proj, is
refused by hpcmem exactly where transformers / peft raise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.job.trl_config import build_job

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.torch
SHIPPED = Path(__file__).resolve().parents[2] / "hpcmem" / "job" / "seq_cls_types.json"


def test_shipped_list_is_the_installed_transformers():
    from transformers.models.auto.modeling_auto import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES

    assert json.loads(SHIPPED.read_text())["types"] == sorted(MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES)


@pytest.mark.parametrize("model_type", ["dbrx", "falcon_mamba", "llama"])
def test_reward_is_refused_where_transformers_has_no_sequence_classification_class(model_type, tmp_path):
    from hpcmem.validate.coverage import reference_config

    cfg, _ = reference_config(model_type)
    import torch

    config = transformers.AutoConfig.for_model(**{**cfg, "num_hidden_layers": 1})
    try:
        with torch.device("meta"):
            transformers.AutoModelForSequenceClassification.from_config(config)   # what RewardTrainer loads
        real_refuses = False
    except ValueError as exc:
        real_refuses = "Unrecognized configuration class" in str(exc)
    try:
        build_job("reward", {"model_name_or_path": model_type}, model=_spec(model_type, tmp_path))
        refused = False
    except SpecError as exc:
        refused = "sequence-classification" in " ".join(exc.problems)
    assert refused == real_refuses == (model_type != "llama")


def _spec(model_type, folder):
    """The model as the coverage sweep builds it (a learned type from its sweep profile), cut to a few layers."""
    from hpcmem.validate.coverage import eval_model, reference_config, sweep_profile

    cfg, _ = reference_config(model_type)
    from hpcmem.models.config import has_family

    profile = None if has_family(cfg) else sweep_profile(model_type, cfg)
    return eval_model(cfg, model_type, profile, folder, layers=2)[0]


def test_lora_on_a_mamba_out_proj_is_refused_as_peft_refuses_it(tmp_path):
    peft = pytest.importorskip("peft")
    cfg = {"model_type": "mamba", "hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 128, "state_size": 8,
           "expand": 2, "conv_kernel": 4}
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**cfg))
    with pytest.raises(ValueError, match="incompatible with Mamba-based models"):
        peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules="all-linear"))
    spec = _spec("mamba", tmp_path)
    with pytest.raises(SpecError, match="peft refuses on Mamba-based models"):
        build_job("sft", {"model_name_or_path": "mamba", "use_peft": True, "lora_target_modules": ["all-linear"]},
                  model=spec)
    build_job("sft", {"model_name_or_path": "mamba", "use_peft": True, "lora_target_modules": ["x_proj", "in_proj"]},
              model=spec)

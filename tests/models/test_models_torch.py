"""hpcmem.models against the installed transformers / peft: every count is checked on a real model built on the meta
device (no memory, no Hub), every recorded default against the library that defines it."""

from __future__ import annotations

import copy
import os
from collections import Counter

import pytest

pytestmark = pytest.mark.torch
os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hpcmem.models import (  # noqa: E402
    SUPPORTED_MODEL_TYPES,
    all_linear_targets,
    catalog,
    catalog_ids,
    count_params,
    linear_modules,
    model_spec_from_config,
    peft_default_targets,
    resolve_model,
)
from hpcmem.models.params import PEFT_DEFAULT_LOST, PEFT_DEFAULT_TARGETS  # noqa: E402
from hpcmem.errors import SpecError  # noqa: E402


# the catalog's causal-LM models (vision-language entries build through AutoModelForImageTextToText; their parts are
# tests/models/test_vision_params.py's)
CAUSAL_LM_IDS = [hub_id for hub_id in catalog_ids() if resolve_model(hub_id).vision is None]


def meta_model(config_dict: dict):
    # a deep copy: transformers standardises nested dicts (rope_scaling) in place, which would change the catalog's
    # config and so its hash, under which the shipped learned profiles are found
    config = transformers.AutoConfig.for_model(**copy.deepcopy(config_dict))
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(config)


def numel(module) -> int:
    """Parameters of a module; `parameters()` yields a tied tensor once, as the checkpoint stores it."""
    return sum(p.numel() for p in module.parameters())


def layer_weights(model) -> Counter:
    """(path inside the layer, in, out, count, is nn.Linear, has bias) of every ≥2-D weight, over all layers."""
    found: Counter = Counter()
    for layer in model.model.layers:
        for path, mod in layer.named_modules():
            if isinstance(mod, torch.nn.Linear):
                found[(path, mod.in_features, mod.out_features, 1, True, mod.bias is not None)] += 1
                continue
            for pname, p in mod.named_parameters(recurse=False):
                if p.dim() == 3:       # fused experts [E, out, in]
                    found[(f"{path}.{pname}", p.shape[2], p.shape[1], p.shape[0], False, False)] += 1
                elif p.dim() == 2:     # router weight [E, H]
                    found[(path, p.shape[1], p.shape[0], 1, False, False)] += 1
    return found


def expected_weights(spec) -> Counter:
    return Counter({(m.name, m.in_features, m.out_features, m.count_per_layer, m.nn_linear, m.bias): m.num_layers
                    for m in linear_modules(spec)})


@pytest.mark.parametrize("hub_id", CAUSAL_LM_IDS)
def test_catalog_count_equals_meta_model(hub_id):
    """Derived counts and the shipped learned profiles' counts alike equal transformers' own instantiation."""
    model = meta_model(catalog()[hub_id]["config"])
    assert numel(model) == count_params(resolve_model(hub_id)).total


@pytest.mark.parametrize("hub_id", CAUSAL_LM_IDS)
def test_linear_modules_equal_meta_model(hub_id):
    spec = resolve_model(hub_id)
    assert layer_weights(meta_model(catalog()[hub_id]["config"])) == expected_weights(spec)


@pytest.mark.parametrize("model_type", SUPPORTED_MODEL_TYPES)
def test_config_class_defaults_match(model_type):
    """A config.json that omits every optional key reads as transformers' config class defaults."""
    defaults = transformers.AutoConfig.for_model(model_type).to_dict()
    spec = model_spec_from_config({"model_type": model_type}, model_type)
    assert model_spec_from_config(defaults, model_type) == spec
    assert numel(meta_model({"model_type": model_type})) == count_params(spec).total


TINY = {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 6,
        "num_attention_heads": 4, "num_key_value_heads": 2}


@pytest.mark.parametrize("model_type,extra", [
    ("qwen2_moe", {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
                   "shared_expert_intermediate_size": 48, "decoder_sparse_step": 2, "mlp_only_layers": [3]}),
    pytest.param("qwen2_moe", {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
                               "shared_expert_intermediate_size": 0, "qkv_bias": False},  # zero-width shared expert
                 marks=pytest.mark.filterwarnings("ignore:Initializing zero-element tensors")),
    ("qwen3_moe", {"num_experts": 4, "num_experts_per_tok": 1, "moe_intermediate_size": 16, "head_dim": 32,
                   "mlp_only_layers": [0, 5], "attention_bias": True}),
    ("llama", {"attention_bias": True, "mlp_bias": True, "head_dim": 8, "tie_word_embeddings": True}),
    ("qwen2", {"head_dim": 32}),
    ("olmo2", {"attention_bias": True}),
    ("gemma3_text", {"attention_bias": True}),
])
def test_layout_variants(model_type, extra):
    config = {"model_type": model_type, **TINY, **extra}
    model, spec = meta_model(config), model_spec_from_config(config, model_type)
    assert numel(model) == count_params(spec).total
    assert layer_weights(model) == expected_weights(spec)


def test_gemma3_text_config_counts_the_language_model():
    outer = transformers.AutoConfig.for_model("gemma3").to_dict()
    spec = model_spec_from_config(outer, "gemma3")
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**outer))
    assert spec.vision is not None and spec.tie_word_embeddings
    assert numel(model.model.language_model) == count_params(spec).total     # lm_head is tied to embed_tokens
    assert numel(model) == count_params(spec).total + spec.vision.num_params   # the tower and projector beside it


@pytest.mark.parametrize("model_type", sorted(PEFT_DEFAULT_TARGETS))
def test_peft_default_targets_equal_peft(model_type):
    constants = pytest.importorskip("peft.utils.constants")
    theirs = constants.TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING.get(model_type)
    if theirs is None or model_type in PEFT_DEFAULT_LOST:
        with pytest.raises(SpecError):
            peft_default_targets(model_type)
    else:
        assert peft_default_targets(model_type) == tuple(theirs)


def test_peft_default_lost_by_moe_conversion_is_refused():
    """peft 0.21.2 with a Mixtral and no target_modules raises (its v5 MoE conversion empties the targets before the
    default is looked up); the estimate refuses the same job instead of assuming q_proj, v_proj."""
    peft = pytest.importorskip("peft")
    import torch
    import transformers

    config = transformers.AutoConfig.for_model("mixtral", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                               num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                               num_local_experts=4)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    with pytest.raises(peft.utils.error.NoMatchingPeftModuleError):
        peft.get_peft_model(model, peft.LoraConfig(task_type="CAUSAL_LM", r=16, lora_dropout=0.05))
    with pytest.raises(SpecError, match="drops its default"):
        peft_default_targets("mixtral")


@pytest.mark.parametrize("hub_id", CAUSAL_LM_IDS)
def test_all_linear_equals_peft(hub_id):
    peft = pytest.importorskip("peft")
    from peft.tuners.tuners_utils import _maybe_include_all_linear_layers

    model = meta_model(catalog()[hub_id]["config"])
    chosen = _maybe_include_all_linear_layers(peft.LoraConfig(target_modules="all-linear"), model).target_modules
    spec = resolve_model(hub_id)          # a derived family or a shipped learned profile
    assert {name.rsplit(".", 1)[-1] for name in chosen} == set(all_linear_targets(spec))
    assert len(chosen) == sum(m.num_layers * m.count_per_layer for m in linear_modules(spec) if m.nn_linear)

"""hpcmem.models.peft_targets against the installed peft: the shipped table is what the libraries define, and on tiny
models of MoE types with fused experts (and Qwen2-MoE, which peft leaves alone) hpcmem's resolution of LoRA targets
is what peft's own get_peft_model makes — the targets it keeps, the parameters it adds, the fused ranks, its errors,
and the adapter weights it creates (shapes, count)."""

from __future__ import annotations

import json
import os
import re
import warnings
from collections import Counter

import pytest

pytestmark = pytest.mark.torch
os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from hpcmem.estimate.lora import lora_layout  # noqa: E402
from hpcmem.job.jobspec import JobSpec  # noqa: E402
from hpcmem.job.spec import TrainSpec  # noqa: E402
from hpcmem.models import model_spec_from_config  # noqa: E402
from hpcmem.models.peft_targets import TABLE_PATH, resolve  # noqa: E402
from hpcmem.trace.peft_moe_table import build_table  # noqa: E402

# one small config for every type: each config class reads the keys it knows (an MoE width under either name, the
# expert count under each type's name, DeepSeek's first dense layer and shared expert)
TINY = {"hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 32, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "num_experts": 4, "num_local_experts": 4,
        "n_routed_experts": 4, "num_experts_per_tok": 2, "vocab_size": 128, "first_k_dense_replace": 1,
        "shared_expert_intermediate_size": 48, "n_shared_experts": 1}
CONVERTED = ("mixtral", "qwen3_moe", "olmoe", "deepseek_v3", "glm4_moe", "qwen3_next", "minimax")
DERIVED = ("mixtral", "qwen3_moe", "qwen2_moe")     # the MoE types hpcmem derives (a ModelSpec from the config)


def tiny(model_type: str):
    config = transformers.AutoConfig.for_model(model_type, **TINY)
    torch.manual_seed(0)
    return config, transformers.AutoModelForCausalLM.from_config(config)


def peft_model(model, targets, r: int = 8):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return peft.get_peft_model(model, peft.LoraConfig(r=r, target_modules=targets, lora_dropout=0.0))


def linear_leaves(model) -> tuple[str, ...]:
    """The nn.Linear leaf names all-linear sees (no output layer)."""
    return tuple(dict.fromkeys(n.rsplit(".", 1)[-1] for n, m in model.named_modules()
                               if isinstance(m, torch.nn.Linear) and not n.endswith("lm_head")))


def test_shipped_table_is_the_installed_libraries():
    shipped = json.loads(TABLE_PATH.read_text(encoding="utf-8"))
    assert shipped == build_table(), "regenerate: python -m hpcmem.trace.peft_moe_table"


@pytest.mark.parametrize("model_type", (*CONVERTED, "qwen2_moe"))
def test_all_linear_resolves_as_peft_does(model_type):
    _, model = tiny(model_type)
    leaves = linear_leaves(model)
    cfg = peft_model(model, "all-linear").peft_config["default"]
    ours = resolve(model_type, ("all-linear",), (), leaves)
    assert {t.rsplit(".", 1)[-1] for t in cfg.target_modules} == set(ours.modules)
    assert set(cfg.target_parameters or ()) == set(ours.parameters)
    assert cfg.rank_pattern == {rf".*\.{re.escape(name)}": 8 * f for name, f in ours.rank_factors}
    assert cfg.alpha_pattern == {rf".*\.{re.escape(name)}": 8 * f for name, f in ours.rank_factors}
    if model_type in CONVERTED:   # the shared experts' and dense layers' gate/up/down lose their adapters
        assert not {"gate_proj", "up_proj", "down_proj", "w1", "w2", "w3"} & set(ours.modules)


@pytest.mark.parametrize("model_type,targets", [
    ("qwen3_moe", ["q_proj", "v_proj", "gate_proj", "up_proj", "down_proj"]),
    ("qwen3_moe", ["q_proj", "v_proj", "down_proj"]),
    ("qwen3_moe", ["q_proj", "k_proj", "v_proj", "o_proj"]),
    ("mixtral", ["q_proj", "w1", "w3", "gate"]),
    ("deepseek_v3", ["q_a_proj", "mlp.gate_proj", "mlp.up_proj"]),
])
def test_a_list_resolves_as_peft_does(model_type, targets):
    _, model = tiny(model_type)
    cfg = peft_model(model, targets).peft_config["default"]
    ours = resolve(model_type, tuple(targets), (), linear_leaves(model))
    assert set(cfg.target_modules) == set(ours.modules)
    assert set(cfg.target_parameters or ()) == set(ours.parameters)
    assert cfg.rank_pattern == {rf".*\.{re.escape(name)}": 8 * f for name, f in ours.rank_factors}


@pytest.mark.parametrize("model_type,targets", [("qwen3_moe", ["q_proj", "gate_proj"]), ("mixtral", ["q_proj", "w3"])])
def test_a_fused_half_raises_peft_error(model_type, targets):
    _, model = tiny(model_type)
    with pytest.raises(ValueError) as raised:
        peft_model(model, targets)
    assert resolve(model_type, tuple(targets), (), linear_leaves(model)).error == str(raised.value)


@pytest.mark.parametrize("model_type", DERIVED)
def test_adapter_weights_are_peft_s(model_type):
    """Every lora_A/lora_B peft creates under all-linear, by shape, against hpcmem's LoraLayout.matrices()."""
    config, model = tiny(model_type)
    pm = peft_model(model, "all-linear")
    theirs = Counter(tuple(p.shape) for n, p in pm.named_parameters() if ".lora_" in n)
    data = config.to_dict()
    if model_type.startswith("qwen"):     # Qwen-MoE configs write it as num_local_experts (their attribute_map)
        data["num_experts"] = config.num_experts
    spec = model_spec_from_config(data, model_type)
    lora = lora_layout(JobSpec(model=spec, train=TrainSpec(
        trainer="sft", use_peft=True, lora_r=8, lora_target_modules=("all-linear",), lora_dropout=0.0)))
    ours = Counter()
    for rows, cols, count in lora.matrices():
        ours[(rows, cols)] += count
    assert ours == theirs
    assert lora.num_params == sum(p.numel() for n, p in pm.named_parameters() if ".lora_" in n)

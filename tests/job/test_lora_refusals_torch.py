"""hpcmem's LoRA refusals held to peft 0.21.2 itself, on the random jobs whose verdicts disagreed with the trace:
- a random job's 3-layer cut of DeepSeek-V3/V3.2 or GLM-MoE-DSA keeps only the first_k_dense_replace dense layers,
  so peft's MoE conversion names expert parameters the model has not: get_peft_model (run here, with TRL's own
  LoraConfig) wraps nothing and takes lora_dropout and DoRA, and hpcmem must not refuse; one layer deeper the cut
  holds an MoE layer, peft raises, and hpcmem must refuse;
- LoRA on PhiMoE's router and on DeepSeek-V4's grouped o_a_proj (nn.Linear subclasses with their own forward) raises
  on the first forward of a tiny real model, and hpcmem refuses exactly the targets that reach them;
- every nn.Linear subclass of the installed transformers is accounted for (hpcmem.models.lora_linear_subclasses)."""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path

import pytest

pytestmark = pytest.mark.torch
os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
trl = pytest.importorskip("trl")

from hpcmem.errors import SpecError  # noqa: E402
from hpcmem.models.lora_linear_subclasses import BROKEN, HARMLESS  # noqa: E402
from hpcmem.trace import layer_map as lay  # noqa: E402
from hpcmem.validate.random_jobs import RandomJob, draw  # noqa: E402
from hpcmem.validate.random_model import job_spec, traced_model  # noqa: E402
from hpcmem.validate.shrink import shrink_config  # noqa: E402

LORA_KEYS = ("lora_r", "lora_alpha", "lora_dropout", "use_dora", "lora_target_modules")


def trl_lora(settings: dict) -> object:
    """The LoraConfig TRL hands to get_peft_model for these settings (trl.get_peft_config of its ModelConfig)."""
    targets = settings.get("lora_target_modules")
    return trl.get_peft_config(trl.ModelConfig(use_peft=True, **{k: settings[k] for k in LORA_KEYS[:-1]},
                                               lora_target_modules=targets))


def peft_raises(config: dict, settings: dict) -> str:
    """What get_peft_model raises on the meta model of `config` with the settings' LoRA ("" when it adapts)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            peft.get_peft_model(lay.build_meta(config), trl_lora(settings))
        except Exception as exc:  # noqa: BLE001 — the verdict
            return f"{type(exc).__name__}: {exc}"
    return ""


def hpcmem_refusal(job: RandomJob) -> str:
    try:
        job_spec(job)
    except SpecError as exc:
        return str(exc)
    return ""


@pytest.mark.parametrize("index", (158, 201, 291, 293, 331, 597, 654))
def test_a_cut_of_dense_layers_only_takes_dropout_and_dora_as_peft_does(index):
    job = draw(1, index)
    assert job.model_type in ("deepseek_v3", "deepseek_v32", "glm_moe_dsa")
    assert job.config["first_k_dense_replace"] >= job.config["num_hidden_layers"]      # no MoE layer in the cut
    assert peft_raises(job.config, job.settings) == ""
    assert hpcmem_refusal(job) == ""


def test_one_moe_layer_more_and_peft_refuses_dropout_and_hpcmem_too():
    spec, config, depth = traced_model("deepseek_v3", 4)
    assert config["first_k_dense_replace"] < config["num_hidden_layers"] == depth == 4
    settings = dict(draw(1, 201).settings)                 # all-linear, lora_dropout 0.05
    job = RandomJob(id="moe", seed=1, index=0, trainer="rloo", model_type="deepseek_v3", config=config,
                    settings=settings, layers=depth)
    raised = peft_raises(config, settings)
    assert raised == "ValueError: lora.ParamWrapper does not work with lora_dropout != 0."
    assert "lora.ParamWrapper does not work with lora_dropout != 0." in hpcmem_refusal(job)
    settings_dora = dict(settings, lora_dropout=0.0, use_dora=True)
    job_dora = RandomJob(**{**job.to_dict(), "settings": settings_dora})
    assert peft_raises(config, settings_dora) == "ValueError: lora.ParamWrapper does not work with use_dora=True."
    assert "lora.ParamWrapper does not work with use_dora=True." in hpcmem_refusal(job_dora)


def test_down_proj_alone_on_a_dense_cut_leaves_peft_nothing_and_hpcmem_says_so():
    """Two names, both expert names on a dense-only cut: peft's conversion moves both to target_parameters (no
    target_modules left) and they match no parameter: NoMatchingPeftModuleError, which hpcmem names."""
    job = draw(1, 654)
    settings = dict(job.settings, lora_target_modules=["down_proj", "gate"])
    assert peft_raises(job.config, settings).startswith("NoMatchingPeftModuleError: No `target_modules` passed")
    refusal = hpcmem_refusal(RandomJob(**{**job.to_dict(), "settings": settings}))
    assert "No `target_modules` passed but also no `target_parameters` found" in refusal


def tiny_forward_raises(model_type: str, targets, **config) -> str:
    cfg = transformers.AutoConfig.for_model(model_type, **config)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pm = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, target_modules=targets,
                                                        task_type="CAUSAL_LM"))
    try:
        pm(input_ids=torch.tensor([[3, 4, 5, 6]]))
    except Exception as exc:  # noqa: BLE001 — the verdict
        return f"{type(exc).__name__}: {exc}"
    return ""


PHIMOE = {"hidden_size": 64, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
          "num_key_value_heads": 2, "vocab_size": 128, "num_local_experts": 4, "num_experts_per_tok": 2}


@pytest.mark.parametrize("index,targets", [(62, "all-linear"), (583, ["k_proj", "router"]), (656, "all-linear")])
def test_lora_on_phimoe_s_router_raises_and_hpcmem_refuses(index, targets):
    job = draw(1, index)
    assert job.model_type == "phimoe"
    want = [targets] if isinstance(targets, str) else targets
    assert job.settings["lora_target_modules"] == want
    assert tiny_forward_raises("phimoe", targets, **PHIMOE) == "AttributeError: 'tuple' object has no attribute 'dtype'"
    refusal = hpcmem_refusal(job)
    assert "mlp.router (PhimoeTopKRouter" in refusal
    assert ("name the modules instead of all-linear, without router (e.g. k_proj,o_proj,q_proj,v_proj)"
            if targets == "all-linear" else "leave router out of lora_target_modules") in refusal


def test_lora_beside_phimoe_s_router_runs_and_hpcmem_takes_it():
    job = draw(1, 583)
    settings = dict(job.settings, lora_target_modules=["k_proj", "v_proj"], use_dora=False, lora_dropout=0.0)
    assert tiny_forward_raises("phimoe", ["k_proj", "v_proj"], **PHIMOE) == ""
    assert "router" not in hpcmem_refusal(RandomJob(**{**job.to_dict(), "settings": settings}))


def test_lora_on_deepseek_v4_s_grouped_o_a_proj_raises_and_hpcmem_refuses():
    spec, config, depth = traced_model("deepseek_v4", 3)
    small = shrink_config(transformers.AutoConfig.for_model("deepseek_v4").to_dict(), max_length=32)
    small["num_hidden_layers"] = 2
    for key in ("layer_types", "mlp_layer_types", "compress_ratios"):
        if isinstance(small.get(key), list):
            small[key] = small[key][:2]
    data = {k: v for k, v in small.items() if k not in ("model_type", "transformers_version", "architectures")}
    assert tiny_forward_raises("deepseek_v4", ["o_a_proj", "q_b_proj"], **data).startswith("RuntimeError: The size")
    assert tiny_forward_raises("deepseek_v4", ["q_b_proj", "o_b_proj"], **data) == ""
    base = {"dtype": "bfloat16", "bf16": True, "gradient_checkpointing": True, "use_peft": True, "lora_r": 8,
            "lora_alpha": 16, "lora_dropout": 0.0, "use_dora": False, "max_length": 256,
            "per_device_train_batch_size": 1}
    job = RandomJob(id="v4", seed=1, index=0, trainer="sft", model_type="deepseek_v4", config=config,
                    settings=dict(base, lora_target_modules=["o_a_proj", "q_b_proj"]), layers=depth)
    assert "self_attn.o_a_proj (DeepseekV4GroupedLinear" in hpcmem_refusal(job)
    other = RandomJob(**{**job.to_dict(), "settings": dict(base, lora_target_modules=["q_b_proj", "o_b_proj"])})
    assert "o_a_proj" not in hpcmem_refusal(other)


def test_falcon_s_linear_subclass_is_harmless_as_listed():
    assert tiny_forward_raises("falcon", "all-linear", hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                               vocab_size=128) == ""


def test_every_linear_subclass_of_transformers_is_accounted_for():
    """The classes `class X(nn.Linear)` in the installed transformers' modeling files are BROKEN's and HARMLESS's."""
    root = Path(transformers.__file__).parent / "models"
    found = {m.group(1) for f in root.glob("*/modeling_*.py")
             for m in re.finditer(r"^class (\w+)\((?:nn|torch\.nn)\.Linear\)", f.read_text(), re.M)}
    listed = {cls for leaves in BROKEN.values() for cls, _ in leaves.values()} | set(HARMLESS)
    assert found == listed


def test_a_number_as_a_target_names_a_decoder_layer_and_peft_refuses_it_as_hpcmem_does():
    """Random job s2-250: CTRL's MLP is an nn.Sequential whose first linear is `ffn.0`, so "0" is a linear's last name
    part — but peft matches every module path ending in ".0", and the first is the decoder layer list's element 0
    (transformer.h.0), which LoRA cannot wrap: get_peft_model raises. With the linear's other names it runs."""
    spec, config, depth = traced_model("ctrl", 3)
    settings = {"lora_r": 8, "lora_alpha": 16, "lora_dropout": 0.05, "use_dora": False,
                "lora_target_modules": ["0", "Wv"]}
    job = RandomJob(id="ctrl", seed=1, index=0, trainer="sft", model_type="ctrl", config=config,
                    settings={**settings, "use_peft": True, "max_length": 128, "gradient_checkpointing": False},
                    layers=depth)
    assert peft_raises(config, settings).startswith("ValueError: Target module EncoderLayer(")
    assert "a number is also an element of the decoder's layer list" in hpcmem_refusal(job)
    fine = {**settings, "lora_target_modules": ["Wq", "Wv"]}
    assert peft_raises(config, fine) == ""
    assert hpcmem_refusal(RandomJob(**{**job.to_dict(), "settings": {**job.settings, **fine}})) == ""


def test_reward_on_a_type_learned_as_its_text_part_is_refused_by_transformers_in_the_trace_as_by_hpcmem():
    """Random job s2-128: Fuyu is learned as its Persimmon text part, and the trace built the reward model from that
    part, which transformers maps to a sequence-classification class — so the trace ran a job TRL cannot load
    (AutoModelForSequenceClassification on Fuyu's own config raises). The trace now asks transformers with the
    checkpoint's config first, and both sides refuse."""
    from hpcmem.validate.random_trace import score, trace_record

    spec, config, depth = traced_model("fuyu", 3)
    job = RandomJob(id="fuyu", seed=1, index=0, trainer="reward", model_type="fuyu", config=config,
                    settings={"dtype": "bfloat16", "bf16": True, "max_length": 64, "per_device_train_batch_size": 2,
                              "gradient_checkpointing": False}, layers=depth)
    assert "no sequence-classification class for model_type 'fuyu'" in hpcmem_refusal(job)
    rec = trace_record(job.to_dict())
    assert rec["outcome"].startswith("refused: ValueError: Unrecognized configuration class")
    assert score(rec)["verdict"] == "parity"

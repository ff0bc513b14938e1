"""hpcmem.models.peft_targets without torch: the answers peft 0.21.2 gives on Qwen3-30B-A3B, Qwen1.5-MoE and
Mixtral-8x7B (read off peft/utils/transformers_weight_conversion.py `_convert_peft_config_moe` by hand; the torch
tests hold them to get_peft_model), the refusals a job meets, and a learned MoE profile that estimates wrapped
experts under checkpointing and says it has not learned them without."""

from __future__ import annotations

import json

import pytest

from hpcmem.cli import run
from hpcmem.datapath import estimator_dir
from hpcmem.errors import SpecError
from hpcmem.estimate.lora import lora_layout
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.spec import TrainSpec
from hpcmem.models import resolve_model
from hpcmem.models.peft_targets import conversion_base, model_targets
from hpcmem.models.profile import config_hash, profile_filename

QWEN3 = "Qwen/Qwen3-30B-A3B"


def lora_job(model: str, **train) -> JobSpec:
    return JobSpec(model=resolve_model(model), train=TrainSpec(trainer="sft", dtype="bfloat16", use_peft=True,
                                                               **{"lora_dropout": 0.0, **train}))


def test_which_types_peft_rewrites():
    assert conversion_base("qwen3_moe") == "qwen2_moe" and conversion_base("mixtral") == "mixtral"
    assert conversion_base("qwen2_moe") is None            # peft's table maps other types onto it, not itself
    assert conversion_base("llama") is None


def test_all_linear_on_qwen3_moe():
    t = model_targets(resolve_model(QWEN3), ("all-linear",), ())
    assert t.modules == ("q_proj", "k_proj", "v_proj", "o_proj")
    assert set(t.parameters) == {"gate.weight", "gate_up_proj", "down_proj"}
    assert t.rank_factors == (("gate_up_proj", 2),)


def test_all_linear_on_qwen1_5_moe_keeps_the_shared_expert():
    """Qwen2-MoE is not rewritten: all-linear takes every nn.Linear, the shared expert's included, and no expert."""
    lora = lora_layout(lora_job("Qwen/Qwen1.5-MoE-A2.7B", lora_target_modules=("all-linear",)))
    assert {m.name for m in lora.adapted} >= {"mlp.shared_expert.gate_proj", "mlp.shared_expert_gate"}
    assert lora.targeted == ()


def test_qwen3_moe_adapter_count_by_hand():
    """r = 16 over 48 layers: q/k/v/o r·(in + out) each, the router r·(H + E), the experts E·r'·(in + out) with
    r' = 32 for gate_up_proj [2·768, 2048] and 16 for down_proj [2048, 768]."""
    h, q, kv, e, i, r = 2048, 32 * 128, 4 * 128, 128, 768, 16
    per_layer = (r * (h + q) + 2 * r * (h + kv) + r * (q + h) + r * (h + e)
                 + e * 2 * r * (h + 2 * i) + e * r * (i + h))
    lora = lora_layout(lora_job(QWEN3, lora_target_modules=("all-linear",)))
    assert lora.num_params == 48 * per_layer


@pytest.mark.parametrize("train,words", [
    ({"lora_target_modules": ("all-linear",), "lora_dropout": 0.05},
     ("lora_dropout 0.05", "lora.ParamWrapper does not work with lora_dropout != 0.")),
    ({"lora_target_modules": ("q_proj", "gate_proj")},
     ("Cannot convert PEFT target(s) gate_proj without also targeting up_proj because they are fused into "
      "gate_up_proj.",)),
    ({"lora_target_modules": ("q_proj", "v_proj", "gate_proj", "up_proj"), "lora_dropout": 0.1},
     ("lora_dropout 0.1", "target_parameters gate_up_proj")),
])
def test_refused_as_peft_refuses(train, words):
    with pytest.raises(SpecError) as refused:
        lora_job(QWEN3, **train)
    for word in words:
        assert word in str(refused.value)


def test_attention_only_list_is_not_rewritten():
    lora = lora_layout(lora_job(QWEN3, lora_target_modules=("q_proj", "v_proj"), lora_dropout=0.05))
    assert [m.leaf for m in lora.adapted] == ["q_proj", "v_proj"] and lora.targeted == ()


def test_learned_moe_profile_estimates_wrapped_experts_under_checkpointing_only(tmp_path, monkeypatch, capsys):
    doc = json.loads((estimator_dir() / "coverage-profiles" / "olmoe.json").read_text())
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / profile_filename("olmoe", config_hash(doc["config"]))).write_text(json.dumps(doc))
    (tmp_path / "config.json").write_text(json.dumps(doc["config"]))
    monkeypatch.setenv("HPCMEM_DATA", str(tmp_path))
    base = ["estimate", "sft", "--model_name_or_path", str(tmp_path / "config.json"), "--use_peft", "true",
            "--dtype", "bfloat16"]
    capsys.readouterr()
    # TRL's default checkpointing: the wrapped stacks' terms join each MoE layer's backward (the learned LoRA cell
    # adapts the nn.Linear targets only); without it the cells do not order them
    assert run([*base, "--lora_target_modules", "all-linear", "--lora_dropout", "0"]) == 0
    assert "experts.gate_up_proj" in capsys.readouterr().out
    assert run([*base, "--lora_target_modules", "all-linear", "--lora_dropout", "0",
                "--gradient_checkpointing", "false"]) == 2
    err = capsys.readouterr().err
    assert "is not learned without checkpointing" in err and "experts.gate_up_proj" in err and "\n" not in err.strip()
    assert run([*base, "--lora_target_modules", "q_proj,k_proj,v_proj,o_proj"]) == 0

"""hpcmem.models, fast tier (no torch): config parsing, errors, exact parameter counts, catalog, resolve, CLI."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from hpcmem.cli import cli
from hpcmem.errors import SpecError
from hpcmem.models import (
    SUPPORTED_MODEL_TYPES,
    ParamBreakdown,
    all_linear_targets,
    catalog,
    catalog_ids,
    count_params,
    linear_modules,
    model_spec_from_config,
    peft_default_targets,
    peft_model_type,
    resolve_model,
)
from hpcmem.models import resolve as resolve_mod
from hpcmem.models.resolve import hub_offline

# Published totals (model cards / safetensors index "total_size" / 2 for bf16 checkpoints).
KNOWN_TOTALS = {
    "meta-llama/Llama-3.1-8B": 8_030_261_248,
    "meta-llama/Llama-3.2-1B": 1_235_814_400,
    "Qwen/Qwen2.5-7B": 7_615_616_512,
    "Qwen/Qwen2.5-0.5B": 494_032_768,
    "mistralai/Mistral-7B-v0.3": 7_248_023_552,
    "google/gemma-2-9b": 9_241_705_984,
    "mistralai/Mixtral-8x7B-v0.1": 46_702_792_704,
}


def by_hand(V, H, I, L, n_h, n_kv, d, tied, qkv_bias=False, norms=2, qk_norm=0, experts=0):
    """The decoder formula written out independently of hpcmem.models.params (weights + biases + RMSNorm gains)."""
    attn = H * n_h * d + 2 * H * n_kv * d + n_h * d * H + (n_h * d + 2 * n_kv * d if qkv_bias else 0) + qk_norm
    mlp = 3 * H * I * max(experts, 1) + experts * H          # experts: E SwiGLUs + an E×H router
    return V * H * (1 if tied else 2) + L * (attn + mlp + norms * H) + H


def test_known_totals_by_hand():
    assert by_hand(128256, 4096, 14336, 32, 32, 8, 128, False) == KNOWN_TOTALS["meta-llama/Llama-3.1-8B"]
    assert by_hand(128256, 2048, 8192, 16, 32, 8, 64, True) == KNOWN_TOTALS["meta-llama/Llama-3.2-1B"]
    assert by_hand(152064, 3584, 18944, 28, 28, 4, 128, False, qkv_bias=True) == KNOWN_TOTALS["Qwen/Qwen2.5-7B"]
    assert by_hand(151936, 896, 4864, 24, 14, 2, 64, True, qkv_bias=True) == KNOWN_TOTALS["Qwen/Qwen2.5-0.5B"]
    assert by_hand(32768, 4096, 14336, 32, 32, 8, 128, False) == KNOWN_TOTALS["mistralai/Mistral-7B-v0.3"]
    assert by_hand(256000, 3584, 14336, 42, 16, 8, 256, True, norms=4) == KNOWN_TOTALS["google/gemma-2-9b"]
    assert by_hand(32000, 4096, 14336, 32, 32, 8, 128, False, experts=8) == KNOWN_TOTALS["mistralai/Mixtral-8x7B-v0.1"]


@pytest.mark.parametrize("hub_id", sorted(KNOWN_TOTALS))
def test_catalog_matches_known_totals(hub_id):
    assert count_params(resolve_model(hub_id)).total == KNOWN_TOTALS[hub_id]


def test_moe_active_params():
    mixtral = count_params(resolve_model("mistralai/Mixtral-8x7B-v0.1"))
    assert mixtral.active == 12_879_925_248                       # "12.9B active" (Mixtral of Experts, §2)
    assert count_params(resolve_model("Qwen/Qwen3-30B-A3B")).active == 3_353_032_704   # "A3B"


@pytest.mark.parametrize("hub_id", catalog_ids())
def test_breakdown_parts_add_up(hub_id):
    b = count_params(resolve_model(hub_id))
    assert sum(b.parts().values()) == b.total
    assert b.num_dense_layers + b.num_moe_layers == b.num_layers


def test_breakdown_rejects_parts_that_do_not_add_up():
    fields = {**count_params(resolve_model("Qwen/Qwen2.5-0.5B")).__dict__}
    fields["total"] += 1
    with pytest.raises(AssertionError, match="add up"):
        ParamBreakdown(**fields)


def test_catalog_shape():
    assert len(catalog()) >= 12
    for hub_id, doc in catalog().items():
        assert doc["source"].startswith(f"https://huggingface.co/{hub_id}/blob/main/config.json")
        spec = resolve_model(hub_id.upper())
        assert spec.name == hub_id    # case-insensitive, canonical name kept
        # a family descriptor covers it, or a learned profile ships with the package for exactly this config, or it is
        # a vision-language type whose tower hpcmem.models.vision describes (its decoder a family's)
        assert doc["config"]["model_type"] in SUPPORTED_MODEL_TYPES or spec.learned is not None or \
            spec.vision is not None


# ---- parsing ----------------------------------------------------------------------------------------------------

def cfg(model_type, **kw):
    base = {"model_type": model_type, "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2}
    return {**base, **kw}


def test_head_dim_explicit_else_derived_else_class_default():
    assert model_spec_from_config(cfg("llama"), "m").head_dim == 16
    assert model_spec_from_config(cfg("llama", head_dim=32), "m").head_dim == 32
    assert model_spec_from_config(cfg("mistral", head_dim=None), "m").head_dim == 16
    assert model_spec_from_config(cfg("qwen3"), "m").head_dim == 128           # Qwen3Config default, not H/heads
    assert model_spec_from_config(cfg("qwen3_moe"), "m").head_dim == 16        # Qwen3MoeConfig has no head_dim


def test_bias_rules():
    qwen2 = model_spec_from_config(cfg("qwen2", attention_bias=False), "m")
    assert qwen2.qkv_bias and not qwen2.o_bias                                 # hard-coded in Qwen2Attention
    llama = model_spec_from_config(cfg("llama", attention_bias=True, mlp_bias=True), "m")
    assert llama.qkv_bias and llama.o_bias and llama.mlp_bias
    assert not model_spec_from_config(cfg("mistral", attention_bias=True), "m").qkv_bias
    moe = model_spec_from_config(cfg("qwen2_moe", qkv_bias=False), "m")
    assert not moe.qkv_bias


def test_gemma_defaults_and_text_config_unwrap():
    g2 = model_spec_from_config(cfg("gemma2"), "m")
    assert g2.tie_word_embeddings and g2.norms_per_layer == 4 and g2.hidden_act == "gelu_pytorch_tanh"
    assert (g2.final_logit_softcapping, g2.attn_logit_softcapping) == (30.0, 50.0)
    wrapped = {"model_type": "gemma3", "tie_word_embeddings": True, "vision_config": {"hidden_size": 1152},
               "text_config": {"model_type": "gemma3_text", "hidden_size": 2560, "num_hidden_layers": 34,
                               "intermediate_size": 10240}}
    g3 = model_spec_from_config(wrapped, "gemma-3-4b")
    # a vision-language config: the decoder is gemma3_text's, the SigLIP tower and projector are counted beside it
    assert (g3.model_type, g3.wrapper_model_type, g3.vocab_size, g3.head_dim) == ("gemma3", "", 262208, 256)
    assert g3.vision is not None and g3.vision.hidden_size == 1152
    assert g3.qk_norm and g3.tie_word_embeddings and peft_model_type(g3) == "gemma3"


def test_phi3_fused_and_olmo2_norms():
    phi = model_spec_from_config(cfg("phi3"), "m")
    assert [m.name for m in linear_modules(phi)] == ["self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj",
                                                     "mlp.down_proj"]
    olmo = model_spec_from_config(cfg("olmo2"), "m")
    assert olmo.qk_norm_scope == "proj"
    assert count_params(olmo).attention_per_layer == 2 * 64 * 64 + 2 * 64 * 32 + (4 + 2) * 16   # q,o + k,v + norms


def test_moe_dense_layer_placement_and_shared_expert():
    spec = model_spec_from_config(cfg("qwen2_moe", num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                                      shared_expert_intermediate_size=96, mlp_only_layers=[0, 2]), "m")
    assert spec.num_dense_layers == 2 and spec.shared_expert_gate                   # layers 0, 2 dense; 1 and 3 sparse
    stepped = model_spec_from_config(cfg("qwen3_moe", decoder_sparse_step=2, mlp_only_layers=[3]), "m")
    assert stepped.num_dense_layers == 3                                            # (i + 1) % 2 == 0: 1, 3; 3 is dense
    b = count_params(spec)
    assert (b.num_moe_layers, b.experts_per_layer, b.shared_expert_per_layer) == (2, 8 * 3 * 64 * 32, 3 * 64 * 96 + 64)
    q3 = model_spec_from_config(cfg("qwen3_moe", shared_expert_intermediate_size=512), "m")
    assert q3.shared_expert_intermediate_size == 0 and not q3.shared_expert_gate   # Qwen3-MoE has no shared expert
    assert not model_spec_from_config(cfg("qwen3_moe", num_experts=0), "m").is_moe


def test_linear_modules_mark_fused_experts():
    mods = {m.name: m for m in linear_modules(resolve_model("mistralai/Mixtral-8x7B-v0.1"))}
    up = mods["mlp.experts.gate_up_proj"]
    assert (up.in_features, up.out_features, up.count_per_layer, up.kind, up.nn_linear) == (4096, 28672, 8, "expert",
                                                                                            False)
    assert not mods["mlp.gate"].nn_linear
    assert all_linear_targets(resolve_model("mistralai/Mixtral-8x7B-v0.1")) == ("q_proj", "k_proj", "v_proj", "o_proj")


def test_peft_default_targets():
    assert peft_default_targets("llama") == ("q_proj", "v_proj")
    with pytest.raises(SpecError, match="phi3.*lora_target_modules"):
        peft_default_targets("phi3")
    with pytest.raises(SpecError, match="no peft default LoRA targets recorded"):
        peft_default_targets("gpt2")


# ---- errors -----------------------------------------------------------------------------------------------------

def test_unknown_architecture_names_type_and_supported():
    with pytest.raises(SpecError) as exc:
        model_spec_from_config({"model_type": "deepseek_v3", "hidden_size": 7168}, "ds")
    assert "'deepseek_v3'" in str(exc.value) and "llama" in str(exc.value) and "qwen3_moe" in str(exc.value)
    with pytest.raises(SpecError, match="model_type None"):
        model_spec_from_config({"hidden_size": 8}, "x")
    with pytest.raises(SpecError, match="inside llava"):
        model_spec_from_config({"model_type": "llava", "text_config": {"model_type": "vicuna"}}, "x")


def test_bad_numbers_are_all_reported():
    with pytest.raises(SpecError) as exc:
        model_spec_from_config(cfg("llama", hidden_size=0, vocab_size="big"), "m")
    assert len(exc.value.problems) == 2
    with pytest.raises(SpecError, match="not a multiple"):
        model_spec_from_config(cfg("llama", num_key_value_heads=3), "m")
    with pytest.raises(SpecError, match="JSON object"):
        model_spec_from_config([1, 2], "m")


# ---- resolve ----------------------------------------------------------------------------------------------------

def test_resolve_file_and_folder(tmp_path):
    folder = tmp_path / "my model; 'x'"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(catalog()["Qwen/Qwen2.5-0.5B"]["config"]))
    assert count_params(resolve_model(str(folder))).total == KNOWN_TOTALS["Qwen/Qwen2.5-0.5B"]
    assert resolve_model(str(folder / "config.json")).model_type == "qwen2"
    with pytest.raises(SpecError, match="holds no config.json"):
        resolve_model(str(tmp_path))
    (tmp_path / "bad.json").write_text("{nope")
    with pytest.raises(SpecError, match="model config .*bad.json is not JSON"):
        resolve_model(str(tmp_path / "bad.json"))


def test_unknown_offline_says_what_to_do():
    with pytest.raises(SpecError, match="unknown model acme/none: not a path, not in the catalog .*local config.json"):
        resolve_model("acme/none", offline=True)


def test_hub_branch_only_when_online(monkeypatch):
    fetched = []
    monkeypatch.setattr(resolve_mod, "_hub_available", lambda: True)
    monkeypatch.setattr(resolve_mod, "_hub_config", lambda repo: fetched.append(repo) or cfg("llama"))
    assert resolve_model("acme/tiny", offline=False).name == "acme/tiny" and fetched == ["acme/tiny"]
    with pytest.raises(SpecError):
        resolve_model("acme/tiny", offline=True)
    with pytest.raises(SpecError):
        resolve_model("not-a-hub-id", offline=False)            # no owner/name: never asks the Hub
    assert fetched == ["acme/tiny"]


def test_hub_offline_env():
    assert hub_offline({"HF_HUB_OFFLINE": "1"}) and hub_offline({"HF_HUB_OFFLINE": "true"})
    assert not hub_offline({}) and not hub_offline({"HF_HUB_OFFLINE": "0"})


def test_import_leaves_torch_alone():
    code = "import hpcmem.models, hpcmem.cli.models, sys; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


# ---- CLI --------------------------------------------------------------------------------------------------------

def test_cli_list_and_show():
    runner = CliRunner()
    out = runner.invoke(cli, ["models", "list"])
    assert out.exit_code == 0 and "meta-llama/Llama-3.1-8B" in out.output and "8.03 B" in out.output
    rows = json.loads(runner.invoke(cli, ["models", "list", "--json"]).output)
    assert {r["hub_id"]: r["num_params"] for r in rows}["Qwen/Qwen2.5-7B"] == KNOWN_TOTALS["Qwen/Qwen2.5-7B"]
    show = runner.invoke(cli, ["models", "show", "google/gemma-2-9b"])
    assert show.exit_code == 0 and "9,241,705,984" in show.output and "softcapping" in show.output
    report = json.loads(runner.invoke(cli, ["models", "show", "qwen/qwen3-30b-a3b", "--json"]).output)
    assert report["params"]["total"] == sum(report["parts"].values()) and report["peft_default_targets"] is None
    bad = runner.invoke(cli, ["models", "show", "acme/none"], env={"HF_HUB_OFFLINE": "1"})
    assert isinstance(bad.exception, SpecError)

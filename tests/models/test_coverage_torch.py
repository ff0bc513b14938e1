"""Coverage, torch tier: the mapping read from transformers' source equals the imported one, and every stored
coverage record (estimator/coverage.jsonl, traced by `hpcmem validate --against coverage`) re-estimated with today's
estimator against its stored trace stays within 3 % (no tracing: the CI subset of the sweep)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.torch
transformers = pytest.importorskip("transformers")


def test_source_mapping_equals_imported_mapping():
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from hpcmem.models.coverage import installed_mapping

    assert installed_mapping() == dict(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def test_stored_coverage_records_rescore_within_3_percent():
    from hpcmem.validate.coverage import load_records, rescore

    stored = {(r["model_type"], r["technique"]): r for r in load_records() if "err_pct" in r}
    if not stored:
        pytest.skip("no coverage records in estimator/coverage.jsonl")
    worse = []
    for rec in rescore():
        if "err_pct" not in rec:
            continue
        before = stored[(rec["model_type"], rec["technique"])]["err_pct"]
        bound = max(3.0, abs(before) + 0.5)        # a case stored above 3 % may not get worse
        if abs(rec["err_pct"]) > bound:
            worse.append(f"{rec['model_type']} {rec['technique']}: {before:+.2f} → {rec['err_pct']:+.2f} %")
    assert not worse, "\n".join(worse)


def test_a_record_traced_on_another_cut_is_stale_not_rescored(tmp_path):
    """A stored trace holds the model it ran: one of 3 Llama-3.1-70B layers rescored against today's 16-layer cut would
    compare two depths. Rescoring drops its error and says what to run; the record of the cut built today is scored."""
    import json

    from hpcmem.validate.coverage import load_records, rescore

    same = next(r for r in load_records() if r["model_type"] == "llama" and r["technique"] == "full+gc")
    assert same["layers"] == 16
    path = tmp_path / "coverage.jsonl"
    path.write_text(json.dumps(same) + "\n" + json.dumps({**same, "layers": 3}) + "\n")
    kept, moved = rescore(path)
    assert "err_pct" in kept and "stale" not in kept
    assert "err_pct" not in moved and "estimated" not in moved
    assert "traced on 3 layers (a prefix); the sweep now cuts 16 layers (a prefix)" in moved["stale"]
    assert "--types llama --redo" in moved["stale"]


def test_no_stored_coverage_record_is_stale():
    from hpcmem.validate.coverage import rescore

    assert [r["model_type"] for r in rescore() if "stale" in r] == []


# tiny configs of the types whose layer count or LoRA targets the learner once could not read
TINY_LONGCAT = {"model_type": "longcat_flash", "vocab_size": 256, "hidden_size": 64, "num_layers": 4,
                "num_attention_heads": 4, "num_key_value_heads": 4, "ffn_hidden_size": 96, "q_lora_rank": 32,
                "kv_lora_rank": 16, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16, "head_dim": 8,
                "moe_topk": 2, "n_routed_experts": 4, "zero_expert_num": 2, "expert_ffn_hidden_size": 32}
TINY_EMU3 = {"model_type": "emu3", "text_config": {
    "model_type": "emu3_text_model", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 96,
    "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "pad_token_id": 0, "bos_token_id": 1,
    "eos_token_id": 2}}
TINY_AFMOE = {"model_type": "afmoe", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 96,
              "moe_intermediate_size": 32, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2, "num_shared_experts": 1,
              "global_attn_every_n_layers": 2, "sliding_window": 16}


@pytest.mark.parametrize("cfg, key, real", [(TINY_LONGCAT, "num_layers", 4), (TINY_EMU3, "num_hidden_layers", 4)])
def test_a_reduced_config_builds_the_real_first_layers_where_the_count_is_not_num_hidden_layers(cfg, key, real):
    """LongCat-Flash builds `num_layers` layers (its num_hidden_layers is 2 × that, a property); Emu3's causal LM takes
    the whole config and builds text_config's layers. The cut must set the count the model builds from."""
    from hpcmem.models.profile import backbone_config
    from hpcmem.trace.learn import reduced_cut

    full, small, keep, _ = reduced_cut(backbone_config(cfg))
    assert (full.layers_key, len(full.layer_kinds)) == (key, real)
    assert keep == (0, 1, 2) and len(small.layer_kinds) == 3


def test_lora_reference_leaves_out_an_attention_name_peft_takes_for_fused_experts():
    """AfMoE's attention has a gate_proj; peft's MoE conversion reads that name as the experts' fused gate_up_proj and
    refuses it without up_proj, as it refuses all-linear (ParamWrapper with dropout): q/k/v/o are what peft takes."""
    import peft

    from hpcmem.trace import layer_map as lay
    from hpcmem.trace.learn import lora_reference

    ref = lora_reference(TINY_AFMOE, lay.layout(TINY_AFMOE))
    assert ref == {"lora_r": 16, "lora_target_modules": ["k_proj", "o_proj", "q_proj", "v_proj"]}
    # peft takes those on the real model class: every adapted module sits in the attention
    model = peft.get_peft_model(lay.build_meta(TINY_AFMOE), peft.LoraConfig(
        r=16, lora_dropout=0.05, task_type="CAUSAL_LM", target_modules=ref["lora_target_modules"]))
    adapted = [n for n, m in model.named_modules() if hasattr(m, "lora_A") and m.lora_A]
    assert adapted and all(".self_attn." in n for n in adapted)


TINY_MAMBA2 = {"model_type": "mamba2", "vocab_size": 256, "hidden_size": 32, "num_hidden_layers": 3, "num_heads": 4,
               "head_dim": 16, "state_size": 8, "n_groups": 1, "expand": 2, "chunk_size": 8}


def test_lora_reference_of_mamba2_is_the_in_proj_named_as_trl_passes_it_on():
    """peft refuses Mamba-2's out_proj (and all-linear, which takes it); in_proj alone, as TRL passes a one-name list
    on (a string, a regex over the whole path), matches nothing. Named twice, TRL's ModelConfig → get_peft_config
    gives peft a list, and peft adapts the in_proj of every layer and nothing else."""
    import peft
    from trl import ModelConfig, get_peft_config

    from hpcmem.trace import layer_map as lay
    from hpcmem.trace.learn import lora_reference

    ref = lora_reference(TINY_MAMBA2, lay.layout(TINY_MAMBA2))
    assert ref == {"lora_r": 16, "lora_target_modules": ["in_proj", "in_proj"]}

    def adapted(targets):
        config = get_peft_config(ModelConfig(use_peft=True, lora_r=16, lora_target_modules=list(targets)))
        model = peft.get_peft_model(lay.build_meta(TINY_MAMBA2), config)
        return sorted(n for n, m in model.named_modules() if hasattr(m, "lora_A") and m.lora_A)

    assert adapted(ref["lora_target_modules"]) == [f"base_model.model.backbone.layers.{i}.mixer.in_proj"
                                                   for i in range(3)]
    with pytest.raises(ValueError, match="not found in the base model"):
        adapted(["in_proj"])
    with pytest.raises(ValueError, match="incompatible with Mamba"):
        adapted(["in_proj", "out_proj"])


@pytest.mark.parametrize("model_type", ["qwen4_exp_text", "qwen4_exp"])
def test_qwen4_exp_reference_config_builds_its_indexed_attention(model_type):
    from hpcmem.trace import layer_map as lay
    from hpcmem.validate.coverage import reference_config

    cfg, source = reference_config(model_type)
    assert "indexer_budget" in source or "text_config" in source
    config = lay.hf_config(cfg)
    text = config.get_text_config()
    assert text.indexer_budget // text.indexer_compress_ratio == 512 and "indexed_attention" in text.layer_types


def test_gemma3n_cut_builds_the_real_layers_it_keeps_with_their_kv_sharing_and_sparsity():
    """A tiny Gemma-3n of the E4B's 35-layer pattern: the learner's cut keeps layers 0, 1, 4, 10, 14, 18, 19, 20, 24,
    34, and transformers' own `kv_sharing_modes` of the cut config gives each kept layer the mode it has in the real
    model (18 and 19 store, 20, 24 and 34 reuse)."""
    from hpcmem.trace import layer_map as lay
    from hpcmem.trace.learn import reduced_cut

    cfg = {"model_type": "gemma3n_text", "vocab_size": 64, "vocab_size_per_layer_input": 64, "hidden_size": 32,
           "hidden_size_per_layer_input": 4, "intermediate_size": 48, "num_hidden_layers": 35,
           "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16, "laurel_rank": 4,
           "num_kv_shared_layers": 15}
    real = lay.hf_config(cfg)
    full, small, keep, small_cfg = reduced_cut(cfg)
    assert keep == (0, 1, 4, 10, 14, 18, 19, 20, 24, 34)
    cut = lay.hf_config(small_cfg)
    assert cut.kv_sharing_modes == [real.kv_sharing_modes[j] for j in keep]
    assert cut.kv_sharing_modes[5:7] == ["store", "store"] and cut.num_kv_shared_layers == 3
    assert cut.activation_sparsity_pattern == [0.95, 0.95, 0.95] + [0.0] * 7
    assert small.signatures == tuple(full.signatures[j] for j in keep)


TINY_FALCON = {"model_type": "falcon", "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 2,
               "num_attention_heads": 4, "new_decoder_architecture": False, "multi_query": True}


def test_lora_reference_takes_all_linear_on_a_linear_subclass_that_maps_in_to_out():
    """Falcon's linears are FalconLinear, an nn.Linear subclass with its own forward (`input @ weight.T` + bias) that
    still maps [.., in] to [.., out], as peft's LoRA Linear needs: all-linear is its reference (the learner had left it
    out with the subclasses that do not, and Falcon's relearned profile came back without LoRA cells). The real
    all-linear run on it adapts every linear of its layers."""
    import peft

    from hpcmem.trace import layer_map as lay
    from hpcmem.trace.learn import lora_reference

    assert lora_reference(TINY_FALCON, lay.layout(TINY_FALCON)) == {"lora_r": 16, "lora_target_modules": ["all-linear"]}
    model = peft.get_peft_model(lay.build_meta(TINY_FALCON), peft.LoraConfig(
        r=16, lora_dropout=0.05, task_type="CAUSAL_LM", target_modules="all-linear"))
    adapted = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if hasattr(m, "lora_A")}
    assert adapted == {"query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"}

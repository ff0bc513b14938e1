"""Zamba and Zamba2: hybrid layers that nest a checkpointed Mamba layer and share one transformer block's weights
(tied: the last hybrid layer holds them, the earlier ones hold none of them but are adapted by peft all the same).

Known answers from the real tiny models on CPU: the decoder layers are the modules the model's forward loops over
(`model.model.layers`, modeling_zamba2.py Zamba2Model.forward), and the tied elements are what torch's own
de-duplicated `model.parameters()` holds fewer than the layers hold one by one."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.torch
torch = pytest.importorskip("torch")

TYPES = ["linear_attention", "linear_attention", "hybrid"] * 2 + ["linear_attention"] * 2     # hybrids at 2 and 5
TINY = {
    "zamba2": {"model_type": "zamba2", "vocab_size": 128, "hidden_size": 64, "num_hidden_layers": 8,
               "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 128, "mamba_d_state": 16,
               "n_mamba_heads": 8, "adapter_rank": 8, "num_mem_blocks": 1, "layers_block_type": TYPES},
    "zamba": {"model_type": "zamba", "vocab_size": 128, "hidden_size": 64, "num_hidden_layers": 8,
              "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 128, "mamba_d_state": 16,
              "n_mamba_heads": 2, "layers_block_type": TYPES},
}


@pytest.mark.parametrize("model_type", sorted(TINY))
def test_hybrid_layers_count_once_and_their_tied_block_belongs_to_the_last(model_type):
    from transformers import AutoModelForCausalLM

    from hpcmem.trace.layer_map import decoder_layers, hf_config, layout

    cfg = TINY[model_type]
    model = AutoModelForCausalLM.from_config(hf_config(cfg))
    assert [id(m) for m in decoder_layers(model)] == [id(m) for m in model.model.layers]     # 8, not 8 + 2 nested
    one_by_one = sum(p.numel() for layer in model.model.layers for p in layer.parameters())
    held = sum(p.numel() for p in model.model.layers.parameters())
    tied = one_by_one - held            # two hybrid layers: the block's elements once too many
    assert tied > 0
    lo = layout(cfg)
    assert lo.total == sum(p.numel() for p in model.parameters())
    assert sum(lo.kinds[k].params for k in lo.layer_kinds) == held
    first, last = lo.kinds[lo.layer_kinds[2]], lo.kinds[lo.layer_kinds[5]]
    assert last.params - first.params == tied
    # peft adapts the tied block's linears in both hybrid layers; only the last one holds their weights
    assert {x.name for x in first.linears} == {x.name for x in last.linears}
    assert all(x.held for x in last.linears) and not all(x.held for x in first.linears)


def test_a_zamba2_cut_runs_its_kept_hybrid_layers_with_the_real_adapter_slots():
    from transformers import AutoModelForCausalLM

    from hpcmem.trace.layer_map import hf_config, layout, reduced_config

    full = dict(TINY["zamba2"], hybrid_layer_ids=[2, 5])       # as a saved config.json holds it
    cut = reduced_config(full, "num_hidden_layers", 0, 8, keep=(0, 5, 7))
    model = AutoModelForCausalLM.from_config(hf_config(cut))
    model(torch.tensor([[1, 2, 3, 4]]))       # the hybrid layer (index 1 of the cut) finds its adapter slot
    # the kept hybrid layer holds the real last hybrid layer's block: both adapter slots, as in the full model
    assert layout(cut).kinds[layout(cut).layer_kinds[1]].params == layout(full).kinds[layout(full).layer_kinds[5]].params


def test_zamba2_adapters_on_the_slots_a_layer_never_runs_get_no_gradient():
    peft = pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    from hpcmem.trace.layer_map import hf_config, layout

    cfg = TINY["zamba2"]
    model = peft.get_peft_model(AutoModelForCausalLM.from_config(hf_config(cfg)),
                                peft.LoraConfig(r=4, target_modules="all-linear"))
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    model(ids, labels=ids).loss.backward()
    no_grad = sum(p.numel() for n, p in model.named_parameters() if "lora_" in n and p.grad is None)
    lo = layout(cfg)
    idle = sum(4 * (x.in_features + x.out_features) for k in lo.layer_kinds for x in lo.kinds[k].linears
               if x.nn_linear and not x.runs)
    assert no_grad > 0 and idle == no_grad

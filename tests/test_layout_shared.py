"""Zamba and Zamba2: hybrid layers that nest a checkpointed Mamba layer and share one transformer block's weights.

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
def test_hybrid_layers_count_once_and_their_tied_block_is_refused_with_its_size(model_type):
    from transformers import AutoModelForCausalLM

    from hpcmem.errors import SpecError
    from hpcmem.trace.layout import decoder_layers, hf_config, layout

    cfg = TINY[model_type]
    model = AutoModelForCausalLM.from_config(hf_config(cfg))
    assert [id(m) for m in decoder_layers(model)] == [id(m) for m in model.model.layers]     # 8, not 8 + 2 nested
    one_by_one = sum(p.numel() for layer in model.model.layers for p in layer.parameters())
    held = sum(p.numel() for p in model.model.layers.parameters())
    tied = one_by_one - held            # two hybrid layers: the block's elements once too many
    assert tied > 0
    with pytest.raises(SpecError, match=f"tensors \\({tied:,} parameters.*tied across 2 of its 8 decoder layers"):
        layout(cfg)

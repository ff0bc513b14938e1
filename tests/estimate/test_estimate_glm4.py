"""GLM-4 (Glm4ForCausalLM) SFT and DPO against the trace of TRL's trainers on Glm4Config's default widths cut to 2
layers (estimator/traces/glm4.jsonl, written by `hpcmem validate trace --reserved --cases estimator/cases/glm4.yaml`),
and one real decoder layer's saved tensors against the estimate's layer terms."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcmem.estimate.activations import layer_saved
from hpcmem.estimate.lora import LoraLayout
from hpcmem.job.shape import MicroBatch, Precision
from hpcmem.models.config import model_spec_from_config
from tests.helpers.stored_cases import estimated_tensor_peak, trace_records

ROOT = Path(__file__).resolve().parents[2]
RECORDS = trace_records(ROOT, "glm4")
MAX_PCT = 3.0


def test_the_matrix_is_all_there():
    assert len(RECORDS) == 8


@pytest.mark.parametrize("case_id", sorted(RECORDS))
def test_estimate_within_3_percent_of_the_trace(case_id):
    traced = RECORDS[case_id]["traced"]
    estimated = estimated_tensor_peak(RECORDS[case_id], ROOT)
    assert abs(estimated - traced) <= MAX_PCT / 100 * traced, (estimated, traced)


def test_the_layout_is_read_from_the_config():
    """q/k/v carry config.attention_bias, o_proj never; four norms per layer; one gate_up_proj (modeling_glm4.py)."""
    spec = model_spec_from_config({"model_type": "glm4"}, "glm4")
    assert (spec.qkv_bias, spec.o_bias, spec.norms_per_layer, spec.fused_gate_up, spec.fused_qkv, spec.rope_cat) == \
        (True, False, 4, True, False, True)
    assert not model_spec_from_config({"model_type": "glm4", "attention_bias": False}, "glm4").qkv_bias


@pytest.mark.torch
def test_one_real_layer_saves_what_the_estimate_counts():
    """A real Glm4DecoderLayer's forward on CPU bf16 (SDPA's flash kernel, the one the trace calls): every tensor
    autograd saves, by storage, less the weights, the layer input and cos/sin, equals the estimate's layer terms but
    for two small ones the estimate leaves out: RMSNorm's [T, 1] fp32 rsqrt, one per norm (4 · T · 4 B), and the
    interleaved cos/sin copies `apply_rotary_pos_emb` makes in every layer (modeling_glm4.py: `repeat_interleave`
    over half of cos and sin, kept by the products with q and k: 2 · T · rotary_dim 32 · 2 B). The partial RoPE's
    torch.cat makes q contiguous per head, so o_proj's input is a copy of SDPA's output (T · 256 · 2 B of the
    total)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.models.glm4.modeling_glm4 import Glm4Model

    cfg_dict = {"model_type": "glm4", "vocab_size": 64, "hidden_size": 256, "intermediate_size": 512,
                "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64}
    config = transformers.AutoConfig.for_model(**cfg_dict, pad_token_id=0)
    config._attn_implementation = "sdpa"
    model = Glm4Model(config).to(torch.bfloat16)
    layer, rows, seq = model.layers[0], 1, 32
    x = torch.randn(rows, seq, 256, dtype=torch.bfloat16, requires_grad=True)
    positions = torch.arange(seq)[None]
    cos, sin = model.rotary_emb(x, positions)
    storages: dict[int, int] = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(x, position_embeddings=(cos, sin), attention_mask=None, position_ids=positions)
    skip = {t.untyped_storage().data_ptr() for t in (*layer.parameters(), x, cos, sin)}
    real = sum(n for ptr, n in storages.items() if ptr not in skip)
    spec = model_spec_from_config(cfg_dict, "glm4")
    mb = MicroBatch(rows=rows, seq=seq, label_tokens=seq, padding_free=False, source="test")
    prec = Precision(weight=2, act=2, residual=2, autocast=False)
    terms = layer_saved(spec, mb, prec, attn="sdpa", layer=0, layer_params=0, lora=LoraLayout(enabled=False))
    assert real - sum(terms.values()) == 4 * seq * 4 + 2 * seq * 32 * 2

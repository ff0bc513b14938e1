"""DoRA on a fused gate_up_proj (GLM-4, Phi-3: `gate, up = gate_up_proj(x).chunk(2, dim=-1)`) runs its backward at its
place in the MLP's backward order: after down_proj's, the product's and act_fn's, by when down_proj's saved terms and
the MLP's saved tensors (gate_up_proj's own [T, 2I] output, which act_fn and the product kept as views, and act_fn's
output) are freed. Oracles: the stored trace of a GLM-4 SFT DoRA job without checkpointing (estimator/random/trace.jsonl,
+4.92 % over when every saved tensor of the layer stayed beside gate_up_proj's DoRA backward); a hand count."""

from __future__ import annotations

import pytest

from tests.helpers.random_records import stored_trace_record


@pytest.mark.torch
def test_glm4_dora_without_checkpointing_within_3_percent_of_its_trace() -> None:
    from hpcmem.validate.random_trace import score

    rec = stored_trace_record("s1-501")
    assert rec["job"]["model_type"] == "glm4" and rec["job"]["settings"]["use_dora"]
    scored = score(rec)
    assert abs(scored["err_pct"]) <= 3.0, scored


def test_fused_gate_up_instant_by_hand() -> None:
    """Hand count, T = 1,000 tokens, H = 64, I = 256, bf16 compute, fp32 adapters, r = 8, no dropout.
    down_proj's saved terms: lora_A's 16-bit input 256 · 2 + its output 8 · 2, DoRA's base and LoRA outputs
    64 · 2 · 2 → 784 B/token. gate_up_proj's DoRA output side: 14 B per output element (DORA_BACKWARD_OUT) · 512 =
    7,168 B/token (its input side, 64 · 3 B, is smaller). At its instant: its 16-bit output gradient 512 · 2 = 1,024,
    the side 7,168, less the MLP's three [T, I] saved tensors 3 · 256 · 2 = 1,536 and down_proj's 784 → 5,872 B/token.
    down_proj's own instant (its [T, I] input gradient 512 + side max(256 · 3, 14 · 64 = 896) = 1,408) and the
    product's (mlp_grads 2 · 256 · 2 = 1,024 + 512 − 784 = 752) are smaller."""
    from hpcmem.estimate.lora import LoraLayout, backward_bytes_per_input
    from hpcmem.estimate.lora_variants import gated_mlp_backward
    from hpcmem.job.shape import Precision
    from hpcmem.models.params import LinearModule

    prec = Precision(weight=2, act=2, residual=2, autocast=False, amp=True)
    gate_up = LinearModule(name="mlp.gate_up_proj", in_features=64, out_features=512, count_per_layer=1,
                           num_layers=1, kind="mlp", nn_linear=True, bias=False)
    down = LinearModule(name="mlp.down_proj", in_features=256, out_features=64, count_per_layer=1, num_layers=1,
                        kind="mlp", nn_linear=True, bias=False)
    lora = LoraLayout(enabled=True, r=8, dora=True, dropout=False, dropout_module=False, adapted=(gate_up, down),
                      num_layers=1)
    T = 1000
    assert lora.module_saved(down, T, prec) == 784 * T
    assert backward_bytes_per_input(lora) == 3
    worst = gated_mlp_backward(lora, (gate_up, down), T, backward_bytes_per_input(lora), inter_tensor=256 * 2 * T,
                               mlp_grads=2 * 256 * 2 * T, kept={"down_proj": 784 * T, "gate_up_proj": 0})
    assert worst == 5872 * T

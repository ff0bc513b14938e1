"""Plain LoRA whose fp32 adapters compute in fp32 without autocast (bf16 off, or a trainer that never enters
accelerate's autocast wrapper — TRL's DistillationTrainer), over 16-bit or fp32 weights: what a dense gated MLP's
adapters add at the recompute's and the backward's worst instants, beyond the layer's saved terms. Over fp32 weights
the input needs no cast (`_cast_input_dtype` returns x itself), so the fp32 copy below is not made; the backward's
order is the same.

peft/tuners/lora/layer.py Linear.forward: `result = self.base_layer(x)` (16-bit), `x = self._cast_input_dtype(x,
lora_A.weight.dtype)` (an fp32 copy, held by the local `x` until forward returns), then
`result + lora_B(lora_A(dropout(x))) * scaling` (fp32: the sum promotes) and `result.to(torch_result_dtype)`.
lora_A saves its fp32 input (dropout's output) and dropout its mask — the layer's saved terms (LoraLayout
`saved_per_layer`).

- The recompute holds, at an adapted linear's dropout, its fp32 input copy beside the 16-bit input itself and the
  base output (and the MLP's input), and at the sum two [tokens, out] tensors beside the base output
  (`recompute_transient`, which the recompute takes under autocast too); down_proj's 16-bit input (the product
  act(gate) · up) is no saved term under LoRA (down_proj's frozen base weight needs no input for a weight gradient;
  hpcmem.estimate.activations `_mlp_saved`).
- The backward (torch/csrc/autograd/engine.cpp: nodes run in reverse creation order and free their saved tensors
  once run): each adapted linear's LoRA path runs before its base path. On the input side lora_A's backward makes
  the fp32 gradient of its input and frees the saved fp32 input; dropout's and the cast's backward follow, each
  freeing the one before: one fp32 [tokens, in] tensor beyond the saved terms at once. On the output side the
  16-bit output gradient becomes fp32 (`.to`'s backward), and the scaling's backward writes another fp32 [tokens,
  out] beside the base path's 16-bit one, in place of the 16-bit output gradient: two fp32 [tokens, out] tensors.
  down_proj's LoRA path thus runs before the product's gradients exist; by then down_proj's saved terms are freed.
"""

from __future__ import annotations

from hpcmem.estimate.lora import LoraLayout
from hpcmem.estimate.lora_variants import FUSED_GATE_UP as FUSED
from hpcmem.estimate.lora_variants import GATED_MLP
from hpcmem.job.shape import Precision
from hpcmem.models.spec import ModelSpec


def applies(lora: LoraLayout, prec: Precision, m: ModelSpec) -> bool:
    """Plain LoRA (no DoRA) with its adapters computing in their own dtype (no autocast), on a dense MLP of the
    three separate linears gate_proj, up_proj, down_proj, adapted there."""
    return not prec.amp and plain_mlp_lora(lora, m)


def plain_mlp_lora(lora: LoraLayout, m: ModelSpec) -> bool:
    """Plain LoRA (no DoRA) on a dense gated MLP (gate_proj, up_proj, down_proj or a fused gate_up_proj), adapted
    there."""
    if not lora.enabled or lora.dora:
        return False
    if not m.gated_mlp or m.is_moe:
        return False
    mods = lora.modules("mlp")
    leaves = GATED_MLP + ((FUSED,) if m.fused_gate_up else ())
    return bool(mods) and all(x.leaf in leaves and x.count_per_layer == 1 for x in mods)


def down_proj_adapted(lora: LoraLayout) -> bool:
    """Whether down_proj carries an adapter: then its LoRA input side, the widest, runs first and frees its saved
    fp32 input before the product's gradients exist (`gated_mlp_backward`); without it the step's generic MLP backward
    (the product's gradients beside the widest adapter's backward) stands."""
    return any(x.leaf == "down_proj" for x in lora.modules("mlp"))


def recompute_transient(lora: LoraLayout, tokens: int, prec: Precision, m: ModelSpec) -> int:
    """The worst adapted MLP linear's forward instant beyond the saved terms, beside the MLP's own input (the
    post-attention norm's output, held as the MLP's `x`; no saved term over frozen weights). peft's
    `result = self.base_layer(x)`, `x = self._cast_input_dtype(x, ...)`, `result = result +
    lora_B(lora_A(dropout(x))) * scaling`, `result.to(torch_result_dtype)` (peft/tuners/lora/layer.py
    `Linear.forward`) holds, beside the linear's fp32 input copy (none when the input is fp32 already, or when the copy
    is what lora_A keeps) and its input where that is no saved term (down_proj's product), the larger of two instants:
    lora_A's, where an active dropout's output (in the adapters' dtype) sits beside the base output under autocast
    (without it lora_A keeps the dropout's output itself, a saved term), and the sum's, where two [tokens, out] tensors
    sit beside the base output — lora_B's output and the scaled one at `* scaling`, the scaled one and the sum at `+` —
    in the adapters' dtype without autocast (lora_B computes in fp32 and the sum promotes to it), in the compute dtype
    under it. gate/up's final output is a saved term of the MLP (the activation's and the product's input) that does not
    exist yet at either instant, and the base output takes its place; down_proj's output is no saved term (traced: a
    GLM-4 distillation job without autocast, LoRA on gate_up_proj, random seed 2 job 188: two fp32 [tokens, 2I]
    beside the 16-bit base output at the recompute's peak)."""
    mods = lora.modules("mlp")
    # a linear before down_proj runs before the activation's output and down_proj's saved terms exist
    later = tokens * m.intermediate_size * prec.act + sum(lora.module_saved(x, tokens, prec) for x in mods
                                                          if x.leaf == "down_proj")
    summed = prec.act if prec.amp else lora.adapter_bytes
    worst = 0
    for x in mods:
        down = x.leaf == "down_proj"
        own_input = tokens * x.in_features * prec.act if down else 0
        # not when the copy is lora_A's saved input itself (traced: a Gemma 3 DPO job without autocast, random seed
        # 1 job 85, +7.2 % with it counted twice)
        copy = tokens * x.in_features * lora.input_copy_bytes(prec)
        base = tokens * x.out_features * prec.act if down else 0
        beside = max(tokens * x.in_features * lora.dropout_output_bytes(prec), 2 * tokens * x.out_features * summed)
        worst = max(worst, copy + own_input + base + beside - (0 if down else later))
    return worst + tokens * m.hidden_size * prec.act


def gated_mlp_backward(lora: LoraLayout, tokens: int, prec: Precision, *, inter_tensor: int, mlp_grads: int,
                       kept: dict[str, int]) -> int:
    """The MLP backward's worst instant beyond the layer's saved terms, the hidden-state gradients and the weight
    gradients (the frame of hpcmem.estimate.lora_variants `gated_mlp_backward`, whose order this follows):
    down_proj's LoRA input side with every saved term alive, then its base path beside its cast-back gradient and
    their sum (three [tokens, I] tensors, down_proj's saved terms freed); the product's backward; up_proj's and
    gate_proj's output sides, each in place of its 16-bit output gradient."""
    mods = {x.leaf: x for x in lora.modules("mlp")}
    a = lora.adapter_bytes

    def side(leaf: str) -> int:
        x = mods[leaf]
        return max(2 * tokens * x.out_features * a, tokens * x.in_features * a)

    freed = kept.get("down_proj", 0)
    worst = mlp_grads + inter_tensor - freed                 # the product's: its input gradient and the two it writes
    if "down_proj" in mods:
        worst = max(worst, tokens * mods["down_proj"].in_features * a, 3 * inter_tensor - freed)
    else:
        worst = max(worst, inter_tensor)
    if "up_proj" in mods:                                     # act's and up's gradients, the product's inputs freed
        worst = max(worst, -2 * inter_tensor - freed + 2 * inter_tensor + side("up_proj"))
    freed += kept.get("up_proj", 0)
    if "gate_proj" in mods:                                   # gate's gradient, act_fn's and gate's saved freed too
        worst = max(worst, -3 * inter_tensor - freed + inter_tensor + side("gate_proj"))
    if FUSED in mods:
        # chunk's backward joins gate's and up's gradients into one [tokens, 2I] output gradient of gate_up_proj, in
        # whose place its output side runs; act_fn's output and gate_up_proj's own (the views act_fn and the product
        # saved) are freed by then
        worst = max(worst, -3 * inter_tensor - freed + side(FUSED))
    return worst

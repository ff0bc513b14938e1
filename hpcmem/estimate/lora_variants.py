"""LoRA's variants that change what peft holds and saves: modules to save, DoRA, LoRA on parameters.

- lora_modules_to_save (peft/utils/other.py ModulesToSaveWrapper): the named module is deep-copied; the copy trains,
  the original stays frozen beside it — the copy's weights, gradients and optimizer states in the base dtype.
  hpcmem sizes lm_head and embed_tokens (V × H each; a tied head gets its own copy) and a reward model's score (H).
  A trained lm_head copy makes TRL's fused head compute its fp32 [V, H] gradient (it reads the copy's weight: seen
  in a CPU run), a trained embed_tokens copy a dense [V, H] gradient.
- use_dora (peft/tuners/lora/dora.py DoraLinearLayer, variants.py DoraLinearVariant.forward): a magnitude vector
  (out_features, adapter dtype) per adapted linear. Each forward builds the adapter's dense weight through an
  identity matrix (`lora_B(lora_A(eye(in)))`: [in, in] then [in, out]), an fp32 copy of the base weight and their
  sum for the column norm — transient, one linear at a time — and keeps for backward the base output and the LoRA
  output (`(m - 1) * base + m * lora`: [tokens, out] each, in the compute dtype; the fp32 sum is cast back to the
  base output's dtype at the end of Linear.forward). With dropout (not nn.Identity) DoRA recomputes the base output
  with `F.linear(x, W)`: x was cast to the adapters' fp32 (Linear.forward `_cast_input_dtype`), so W is copied to fp32
  and autocast casts that copy back to the compute dtype — a fresh copy of W that the matmul saves for backward.
- lora_target_parameters (peft/tuners/lora/layer.py ParamWrapper): LoRA on a bare nn.Parameter, in practice the
  fused experts of an MoE layer (r·(in + out) per expert). During the layer's forward `nn.utils.parametrize` holds
  the adapted parameter W + ΔW (a fused expert stack: one `baddbmm`, `_LoraFactorsProxy`) in the parameter's dtype,
  and the expert matmuls save it for their input and weight gradients: one copy of the targeted parameters per
  layer, kept until that layer's backward, with the factors cast to that dtype; the experts, now trained, keep their
  routed input and gated product too (`trained_experts_saved`). peft refuses it with lora_dropout ≠ 0 or use_dora
  (hpcmem.job.param_wrapper_rules); on MoE types with fused experts peft makes it out of all-linear itself
  (hpcmem.models.peft_targets).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpcmem.job.jobspec import JobSpec
from hpcmem.job.trainers import entry
from hpcmem.models.module_names import reaches
from hpcmem.models.params import LinearModule

if TYPE_CHECKING:
    from hpcmem.estimate.lora import LoraLayout
    from hpcmem.job.shape import MicroBatch, Precision
    from hpcmem.models.spec import ModelSpec

def modules_to_save(job: JobSpec) -> tuple[tuple[str, int], ...]:
    """(name, elements) of each module peft copies for training: none for a name no module of the type ends with
    (hpcmem.models.module_names `reaches`: RWKV's head is `head`, so `lm_head` reaches nothing there)."""
    m = job.model
    sizes = {"lm_head": m.vocab_size * m.hidden_size, "embed_tokens": m.vocab_size * m.hidden_size,
             "score": m.hidden_size,
             # dense [H, H] and the LayerNorm's weight (their biases off by default: classifier_bias, norm_bias)
             "prediction head": m.hidden_size * m.hidden_size + m.hidden_size}
    if entry(job.train.trainer).head == "score":
        sizes["lm_head"] = 0                          # a reward model has no vocabulary head to copy
    reached = (reaches(m.model_type, name) for name in job.train.lora_modules_to_save if name in sizes)
    return tuple((role, sizes[role]) for role in dict.fromkeys(reached) if role is not None)


def saved_per_token(lora: LoraLayout, mods: tuple[LinearModule, ...], prec: Precision) -> int:
    """DoRA's base and LoRA outputs kept per token, over all layers, by the products `(m - 1) * base` and
    `m * lora` (variants.py DoraLinearVariant.forward → dora.py DoraLinearLayer.forward), in the compute dtype under
    autocast. Without autocast both are in the adapters' dtype — lora_B's output, and with dropout the base output
    recomputed by `F.linear` from the input cast to that dtype — except without a dropout module
    (`LoraLayout.dropout_module`), where the base output is the base layer's own, in the weights' dtype."""
    per_out = dora_out_bytes(lora, prec)
    return sum(m.out_features * per_out * m.count_per_layer * m.num_layers for m in mods)


def dora_out_bytes(lora: LoraLayout, prec: Precision) -> int:
    """`saved_per_token`'s bytes per output feature of one adapted linear (0 without DoRA)."""
    if not lora.dora:
        return 0
    if prec.amp:
        return 2 * prec.act
    return lora.adapter_bytes + (lora.adapter_bytes if lora.dropout_module else prec.act)


def dora_weight_copy_bytes(lora: LoraLayout, prec: Precision) -> int:
    """Bytes per base-weight element DoRA's `F.linear(x, weight)` keeps (with an nn.Dropout only, `LoraLayout.dropout_module`:
    without one DoRA reuses the base output). dora.py DoraLinearLayer.forward casts the base weight to the input's dtype (`weight.to(x.dtype)`),
    and the input was cast to the adapters' dtype (layer.py Linear.forward `_cast_input_dtype`): under autocast the
    matmul saves autocast's 16-bit cast of that copy; without it, that copy itself — a fresh one when the adapters'
    dtype is not the weights' (fp32 adapters over 16-bit weights), W itself when it is."""
    if not (lora.dora and lora.dropout_module):
        return 0
    if prec.amp:
        return prec.act
    return lora.adapter_bytes if lora.adapter_bytes != prec.weight else 0


def saved_weights(lora: LoraLayout, mods: tuple[LinearModule, ...], prec: Precision) -> int:
    """Weight-sized tensors kept for backward, over all layers: DoRA's copy of the base weight
    (`dora_weight_copy_bytes`); the adapted parameters of lora_target_parameters."""
    dora = sum(m.in_features * m.out_features * dora_weight_copy_bytes(lora, prec) * m.count_per_layer
               * m.num_layers for m in mods)
    targeted = sum(m.in_features * m.out_features * prec.weight * m.count_per_layer * m.num_layers
                   for m in lora.targeted)
    # the fold casts lora_A and lora_B to the parameter's dtype for baddbmm, which keeps both casts for its backward
    # (peft/tuners/lora/layer.py ParamWrapper `_get_lora_factors`); no copy where the adapters have that dtype already
    factors = sum(lora.rank(m) * (m.in_features + m.out_features) * m.count_per_layer * m.num_layers * prec.weight
                  for m in lora.targeted) if lora.adapter_bytes != prec.weight else 0
    return dora + targeted + factors


def trained_experts_saved(m: ModelSpec, mb: MicroBatch, prec: Precision, layer: int, lora: LoraLayout) -> int:
    """What an MoE layer keeps beyond the frozen experts' saved tensors when its fused experts are wrapped (their
    adapted weight W + ΔW needs a weight gradient): transformers' grouped-mm experts keep the routed copy of the
    hidden states [tokens·k, H] for gate_up_proj's and the gated product [tokens·k, I] for down_proj's
    (transformers/integrations/moe.py `grouped_mm_experts_forward`; a frozen expert stack frees both in the forward)."""
    if not (lora.enabled and m.is_moe and layer >= m.num_dense_layers
            and any(t.kind == "expert" for t in lora.targeted)):
        return 0
    return mb.tokens * m.num_experts_per_tok * (m.hidden_size + m.moe_intermediate_size) * prec.act


def wrapped_notes(job: JobSpec, lora: LoraLayout, prec: Precision) -> list[str]:
    """What the estimate of wrapped expert stacks has not been held to the trace on (estimator/LOG.md)."""
    if not (lora.enabled and any(m.kind == "expert" for m in lora.targeted)):
        return []
    out = []
    if prec.autocast:
        out.append("not held to the trace: LoRA on wrapped expert stacks over fp32 weights (their W + ΔW and matmuls "
                    "stay fp32 under autocast); the trace found this estimate up to ~12 % high on short rows. "
                    "--dtype bfloat16 is the setting held to it within 3 %")
    if job.parallel.world_size > 1:
        out.append("not traced: LoRA on wrapped expert stacks across GPUs (the adapters' sharding and the W + ΔW a "
                   "sharded stack gathers were traced on one GPU only)")
    return out


def wrapped_weight_gradient(lora: LoraLayout, prec: Precision) -> int:
    """The MoE layer's backward beyond what it keeps: each wrapped stack's matmul makes the gradient of its adapted
    weight W + ΔW ([E, out, in] in the weight's dtype: torch grouped_mm's weight gradient, which the fold's baddbmm
    turns into lora_A's and lora_B's) while that stack's saved W + ΔW is still alive; stacks run backward in reverse
    (down_proj, then gate_up_proj, then the router), each one's saved copy freed before the next. The worst instant
    over the layer's saved copies, max(down, gate_up − down) for the usual pair."""
    worst, freed = 0, 0
    for m in reversed(lora.targeted):
        size = m.in_features * m.out_features * m.count_per_layer * prec.weight
        worst = max(worst, size - freed)
        freed += size
    return worst


# DoRA's [tokens, features] temporaries per adapted linear, in bytes per element, for fp32 adapters under bf16
# autocast (peft's default), measured with hpcmem.trace's tracker on one peft DoRA linear (estimator/LOG.md): the
# forward's fp32 products `(m - 1) * base`, `m * lora * scaling`, their sum and
# the sum with the base output before the cast back (variants.py DoraLinearVariant.forward, dora.py
# DoraLinearLayer.forward); their gradients in backward (the fp32 gradient of that sum, one per product and the
# magnitude's [tokens, out] product before its reduction); dropout adds the dropped fp32 input and its casts.
DORA_FORWARD = {"out": 6.0, "in": 0.5}
DORA_FORWARD_DROPOUT = {"out": 3.0, "in": 1.0}
# the output side of DoRA's backward (replaces LoRA's when larger): 20 measured on the one linear, less what the layer's
# estimate already holds at that instant — the linear's own saved base and LoRA outputs (4) and its output gradient (2)
DORA_BACKWARD_OUT = 14.0
DORA_BACKWARD_DROPOUT_IN = 5.0       # dropout's input side, on top


def _forward_output(lora: LoraLayout, m: LinearModule, tokens: int) -> int:
    per = DORA_FORWARD["out"] * m.out_features + DORA_FORWARD["in"] * m.in_features
    if lora.dropout:
        per += DORA_FORWARD_DROPOUT["out"] * m.out_features + DORA_FORWARD_DROPOUT["in"] * m.in_features
    return int(tokens * per)


def _weight_norm(lora: LoraLayout, m: LinearModule, tokens: int, prec: Precision, quantized: bool) -> int:
    """The worst instant of one adapted linear's DoRA weight norm (peft/tuners/lora/dora.py, training mode: no cache),
    in bytes beyond the layer's saved terms. `get_lora_weight` makes eye [in, in] in the adapter dtype and runs
    lora_B(lora_A(eye)): under autocast lora_A casts the eye to 16 bits and saves that copy for its weight's gradient
    (alive to the end of the linear's forward; without autocast it saves the eye itself), lora_B returns [in, out] in
    the compute dtype; then the eye dies. `forward` copies that to the input's dtype (the adapter dtype: peft's
    `_cast_input_dtype`), takes the base weight in that dtype (a copy when it differs; a quantized weight is first
    dequantized to 16 bits) and `get_weight_norm` adds the scaled adapter weight to it (two [in, out] temporaries).
    Instants: the eye's, and the sum's; beside both, the linear's base output and its input cast to the adapter dtype
    (a copy when the input is 16-bit). The layer's saved terms count this linear's saved base-weight copy
    (`dora_weight_copy_bytes`), which does not exist yet at either instant — unless it is that same fp32 copy
    (no autocast), alive at the sum's."""
    a = lora.adapter_bytes
    c = prec.act if prec.amp else a          # lora_A(eye)'s compute dtype
    n_in, n_out = m.in_features, m.out_features
    cast_eye = c * n_in * n_in if c != a else 0
    saved_eye = cast_eye or a * n_in * n_in  # what lora_A keeps for its weight's gradient
    base = 2 * n_in * n_out if quantized else (a * n_in * n_out if prec.weight != a else 0)
    counted = n_in * n_out * dora_weight_copy_bytes(lora, prec)
    eye = a * n_in * n_in + cast_eye + c * n_in * (lora.rank(m) + n_out)
    norm = saved_eye + 3 * a * n_in * n_out + base
    beside = tokens * (n_in * a * (prec.act != a) + n_out * prec.act)
    return max(beside + max(eye, norm) - counted, 0)


def forward_transient(lora: LoraLayout, tokens: int, prec: Precision, quantized: bool) -> int:
    """DoRA's forward temporaries of the worst adapted linear, one linear at a time: first its weight norm
    (`_weight_norm`), then its fp32 output products (DORA_FORWARD)."""
    if not (lora.enabled and lora.dora and lora.adapted):
        return 0
    return max(max(_weight_norm(lora, m, tokens, prec, quantized), _forward_output(lora, m, tokens))
               for m in lora.adapted)


def forward_instant(lora: LoraLayout, tokens: int, prec: Precision, quantized: bool) -> int:
    """DoRA's worst whole-forward instant over the adapted linears, one linear at a time (`_forward_instant`), beyond
    the layer's saved terms; 0 without DoRA."""
    if not (lora.enabled and lora.dora and lora.adapted):
        return 0
    return max(_forward_instant(lora, m, tokens, prec, quantized) for m in lora.adapted)


def _forward_instant(lora: LoraLayout, m: LinearModule, tokens: int, prec: Precision, quantized: bool,
                     unmade: int = 0, products: int = 3) -> int:
    """The worst instant of one adapted linear's whole DoRA forward, in bytes beyond the layer's saved terms, each
    tensor named (peft/tuners/lora/variants.py DoraLinearVariant.forward, dora.py DoraLinearLayer.forward):
    - the weight norm's two instants (`_weight_norm`), beside which with dropout lies the dropped input: nn.Dropout's
      output in the adapter dtype, the `x` DoRA's forward reads (its mask is a saved term);
    - then, to the end of the forward, the locals `lora_weight` and `weight` (the adapter weight and the base weight
      in the input's dtype, [in, out] each; the base weight's is the saved copy itself without autocast) and what
      lora_A saved of the eye stay alive beside the base output and the input casts;
    - the output products `(mag_norm_scale - 1) * base_result`, `mag_norm_scale * lora_result`, `* scaling`: three
      [tokens, out] tensors in the magnitude's dtype (the adapter dtype) before the sum frees two — `products` of
      them where a recompute stops early (torch/utils/checkpoint.py `_StopRecomputationError`);
    - with a dropout module (`LoraLayout.dropout_module`, also at p = 0), `F.linear(x, weight)` under autocast: its
      16-bit cast of x [tokens, in], a transient.
    lora_result, base_result and the base-weight copy F.linear keeps are saved terms — without a dropout module
    base_result is the base layer's own output, so it is not counted again among the locals; `unmade`: the linear's own saved
    terms that the caller counts but that do not exist yet at the weight norm (LoraLayout
    `saved_after_weight_norm`)."""
    a = lora.adapter_bytes
    c = prec.act if prec.amp else a
    n_in, n_out = m.in_features, m.out_features
    dropped = a * tokens * n_in if lora.dropout else 0
    norm = _weight_norm(lora, m, tokens, prec, quantized) + dropped - unmade
    saved_eye = c * n_in * n_in
    base = 2 * n_in * n_out if quantized else (a * n_in * n_out if prec.weight != a else 0)
    counted = n_in * n_out * dora_weight_copy_bytes(lora, prec)
    weight_local = max(base - (0 if prec.amp else counted), 0)
    base_local = n_out * prec.act if lora.dropout_module else 0
    held = (tokens * (n_in * a * (prec.act != a) + base_local) + dropped + a * n_in * n_out + weight_local
            + saved_eye)
    product_instant = held + products * a * tokens * n_out
    base_output = held + (c * tokens * n_in if prec.amp and lora.dropout_module else 0)
    return max(norm, product_instant, base_output)


def gated_mlp_recompute(lora: LoraLayout, tokens: int, prec: Precision, quantized: bool, *, inter_tensor: int,
                        mlp_saved: int, kept: dict[str, int], hidden_tensor: int) -> int | None:
    """The worst DoRA forward instant of a checkpointed layer's recompute, in bytes beyond the layer's saved terms
    and its kept input; None where the layer's MLP is not the dense gated one of `GATED_MLP`. The recompute runs the
    layer's forward in order (transformers models/llama/modeling_llama.py LlamaDecoderLayer.forward: attention, then
    the MLP), so at an adapted linear's forward (`_forward_instant`) the saved terms made after it do not exist yet:
    at the attention's projections none of the MLP's (its three [tokens, I] tensors, `mlp_saved`, and its adapters'
    `kept`); at gate_proj's the same; at up_proj's, up's output and down_proj's; at down_proj's all of them exist and
    its input, the product [tokens, I], is alive beside (not a saved term: the frozen down_proj keeps no input).
    Beside every one lie the decoder layer's locals, [tokens, H] each (`hidden_tensor`, the residual stream's dtype),
    which no backward node keeps: in the attention the input norm's output (the residual is the layer's input, kept by
    the checkpoint); in the MLP the residual after the attention and the post-attention norm's output."""
    mlp = tuple(m for m in lora.adapted if m.kind != "attention")
    if any(m.leaf not in GATED_MLP or m.kind != "mlp" or m.count_per_layer != 1 for m in mlp):
        return None
    down = next((m for m in mlp if m.leaf == "down_proj"), None)
    arrived = recompute_output_gradients(lora, down, tokens, prec) if down is not None else 0
    later = {"gate_proj": mlp_saved + kept.get("up_proj", 0) + kept.get("down_proj", 0),
             "up_proj": inter_tensor + kept.get("down_proj", 0), "down_proj": -inter_tensor}
    before_mlp = mlp_saved + sum(kept.values())

    def at(m: LinearModule) -> int:
        if m.kind == "attention":
            return hidden_tensor - before_mlp
        return 2 * hidden_tensor - later[m.leaf]

    # down_proj's is the layer's last saved product: the recompute stops after the first of its three (traced)
    return max((max(_forward_instant(lora, m, tokens, prec, quantized,
                                     unmade=lora.saved_after_weight_norm(m, tokens, prec),
                                     products=1 if m.leaf == "down_proj" else 3) + at(m), 0)
                for m in lora.adapted), default=0) + arrived


def recompute_output_gradients(lora: LoraLayout, m: LinearModule, tokens: int, prec: Precision) -> int:
    """The gradients an adapted down_proj's DoRA output side has made when a checkpointed layer's recompute starts,
    [tokens, out] each. Non-reentrant checkpointing recomputes at the first backward node that unpacks a saved tensor
    (torch/utils/checkpoint.py `_checkpoint_hook` unpack_hook); autograd runs the layer's nodes in reverse creation
    order, and the last ones save nothing: the residual add (modeling_llama.py LlamaDecoderLayer.forward), the cast
    `result.to(torch_result_dtype)` (peft/tuners/lora/layer.py Linear.forward), the sum `result + dora`
    (variants.py DoraLinearVariant.forward), the sum of the two products and `* scaling` (a Python float; dora.py
    DoraLinearLayer.forward) — the product `mag_norm_scale * lora_result` is the first that unpacks. By then exist:
    the cast's backward, the gradient in the magnitude's dtype (the adapter dtype: fp32 magnitude × a 16-bit base
    output promotes the sum) where the base output's dtype differs; the sum's backward cast of it to the base
    output's dtype (autograd's validate_outputs casts a gradient to its input's dtype); and `* scaling`'s backward,
    one more in the magnitude's dtype. The gradient arriving at the layer is counted by the caller."""
    a = lora.adapter_bytes
    base = prec.act if prec.amp else prec.residual
    out = tokens * m.out_features
    return out * a + (out * (a + base) if base != a else 0)


def _backward_one(lora: LoraLayout, m: LinearModule, tokens: int, lora_per_input: int) -> int:
    side = max(tokens * m.in_features * lora_per_input, int(tokens * m.out_features * DORA_BACKWARD_OUT))
    return side + (int(tokens * m.in_features * DORA_BACKWARD_DROPOUT_IN) if lora.dropout else 0)


def backward_transient(lora: LoraLayout, mods: tuple[LinearModule, ...], tokens: int, lora_per_input: int) -> int:
    """The worst adapted linear's backward temporaries under DoRA: LoRA's input side (`lora_per_input` bytes per
    input element, hpcmem.estimate.lora.backward_transient) or DoRA's output side, whichever is larger, plus
    dropout's input side (measured as DORA_* above)."""
    return max((_backward_one(lora, m, tokens, lora_per_input) for m in mods), default=0)


# the gated MLP as transformers writes it (models/llama/modeling_llama.py LlamaMLP.forward, and the Qwen2, Qwen3,
# Mistral, OLMo-2, Gemma 2/3 copies; EXAONE, InternLM3 and IQuestCoder run Llama's modeling):
# down_proj(act_fn(gate_proj(x)) * up_proj(x)) — gate_proj's node is made first, then act_fn's, up_proj's, the
# product's and down_proj's
GATED_MLP = ("gate_proj", "up_proj", "down_proj")
# Phi-3's and GLM-4's gate and up in one linear (modeling_phi3.py Phi3MLP.forward, modeling_glm4.py Glm4MLP.forward:
# `gate, up_states = self.gate_up_proj(hidden_states).chunk(2, dim=-1)`, then down_proj(up_states * act_fn(gate)))
FUSED_GATE_UP = "gate_up_proj"


def gated_mlp_backward(lora: LoraLayout, mods: tuple[LinearModule, ...], tokens: int, lora_per_input: int, *,
                       inter_tensor: int, mlp_grads: int, kept: dict[str, int]) -> int | None:
    """The worst instant of a dense gated MLP's backward under DoRA, in bytes beyond the layer's saved terms, the
    hidden-state gradients and the layer's weight gradients (hpcmem.estimate.step); None where the MLP is not the
    linears of `GATED_MLP` or a fused gate_up_proj and down_proj. Torch's autograd engine runs the ready node with the highest sequence
    number first (torch/csrc/autograd/engine.cpp ReadyQueue, CompareNodeTaskTime): the nodes run in reverse creation
    order, and each frees its saved tensors once it has run (retain_graph off). So:
    - down_proj's backward (if it is adapted): every saved tensor of the layer alive, its base path's input gradient
      (one [tokens, I] tensor in the compute dtype, `inter_tensor`) beside its DoRA backward;
    - the product's (MulBackward0): its input gradient and the two it writes (`mlp_grads` + `inter_tensor`), with
      down_proj's saved terms freed;
    - up_proj's: the product's saved inputs act(gate) and up's output are freed, and down_proj's saved terms; alive
      are up's output gradient and act's (2 × `inter_tensor`, one [tokens, I] tensor in the compute dtype);
    - gate_proj's, after act_fn's backward: gate's output is freed too (the MLP's three saved [tokens, I] tensors,
      hpcmem.estimate.activations `_mlp_saved`), and up_proj's saved terms; alive is gate's output gradient.
    - a fused gate_up_proj's (`FUSED_GATE_UP`), after the product's and act_fn's backward: chunk's backward has joined
      gate's and up's gradients into its one [tokens, 2I] output gradient (two `inter_tensor`), and the MLP's saved
      tensors are freed — act_fn's output and gate_up_proj's own [tokens, 2I] output, which act_fn's `gate` and the
      product's `up_states` (views of it) kept.
    Each adapted linear's DoRA backward (`_backward_one`, its output gradient and saved outputs apart) sits at its own
    instant; `kept`: leaf → what that module keeps for backward (LoraLayout.module_saved)."""
    if not mods or any(m.leaf not in GATED_MLP + (FUSED_GATE_UP,) or m.kind != "mlp" or m.count_per_layer != 1
                       for m in mods):
        return None
    side = {m.leaf: _backward_one(lora, m, tokens, lora_per_input) for m in mods}
    freed = kept.get("down_proj", 0)
    worst = mlp_grads + inter_tensor - freed
    if "down_proj" in side:
        worst = max(worst, inter_tensor + side["down_proj"])
    if "up_proj" in side:
        worst = max(worst, -2 * inter_tensor - freed + 2 * inter_tensor + side["up_proj"])
    freed += kept.get("up_proj", 0)
    if "gate_proj" in side:
        worst = max(worst, -3 * inter_tensor - freed + inter_tensor + side["gate_proj"])
    if FUSED_GATE_UP in side:
        worst = max(worst, -3 * inter_tensor - freed + 2 * inter_tensor + side[FUSED_GATE_UP])
    return worst

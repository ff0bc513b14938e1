"""Saved activations per decoder layer, for gradient checkpointing off / full / selective, and activation offloading.

Starting point: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", s·b·h·(34 +
5·a·s/h) bytes per GPT layer in 16-bit. That formula does not fit a Llama-family layer in TRL, so every term below
is derived from what autograd saves in transformers' modelling code (modeling_llama.py and kin), checked against the
trace (hpcmem trace; estimator/LOG.md):

- RMSNorm (LlamaRMSNorm.forward) upcasts its input to fp32 (saved by pow/mul: 4 B/elt), saves the normalised tensor
  in the residual dtype for the weight multiply, and its output is saved by the next linear in the compute dtype.
- Flash/SDPA-flash attention saves q (after RoPE), k, v, the output (a view of o_proj's input) and an fp32
  logsumexp per head and token (no s×s matrix). Eager attention also keeps the [b, heads, s, s] probabilities.
- A gated MLP saves gate out (for the activation), act out and up out (for the product) and the product (for
  down_proj): 4 tensors of the intermediate size.
- Under bf16 autocast with fp32 weights, autocast caches a 16-bit copy of every weight it casts and autograd saves
  it: 2 B per layer parameter.
"""

from __future__ import annotations

from hpcmem.estimate import lora_variants
from hpcmem.estimate.lora import SHARED_INPUT, LoraLayout
from hpcmem.job.shape import MicroBatch, Precision
from hpcmem.job.spec import TrainSpec
from hpcmem.models.final_norm import restored_width
from hpcmem.models.spec import ModelSpec

FP32 = 4
# Sizes of the fp32 logsumexp saved by flash attention: one value per (token, head).
LSE_BYTES = FP32


# Gemma's RMSNorm multiplies by (1 + weight) in fp32 and casts at the end (modeling_gemma2/3.py Gemma*RMSNorm), and
# OLMo-2's by weight (modeling_olmo2.py Olmo2RMSNorm: `(self.weight * hidden_states).to(input_dtype)`, where Llama
# casts before the multiply), so the normalised tensor it keeps for the weight gradient is fp32 whatever the residual
# dtype — for the layer norms and OLMo-2's q/k norms alike. A vision-language spec carries its outer model_type:
# shieldgemma2's decoder is Gemma 3's (Gemma3ForConditionalGeneration built from a ShieldGemma2Config). Gemma 4's
# vision encoder layers likewise (modeling_gemma4.py Gemma4RMSNorm: `normed_output * self.weight.float()`, then
# `type_as`): hpcmem.estimate.vision_gemma4's block spec.
# q/k norms applied right after each projection, before the next one runs (modeling_qwen3.py, modeling_qwen3_moe.py
# `self.q_norm(self.q_proj(hidden_states)...)`, modeling_olmo2.py `self.q_norm(self.q_proj(hidden_states))`); Gemma 3
# projects q, k and v first and normalises after (modeling_gemma3.py Gemma3Attention.forward)
QK_NORM_BETWEEN_PROJECTIONS = ("qwen3", "qwen3_moe", "olmo2")
FP32_NORM_MULTIPLY = ("gemma", "gemma2", "gemma3", "gemma3_text", "olmo2", "shieldgemma2", "gemma4_vision")


def _normed_bytes(m: ModelSpec, prec: Precision) -> int:
    return FP32 if m.model_type in FP32_NORM_MULTIPLY else prec.residual


def _norm_saved(h: int, prec: Precision, feeds_linear: bool, frozen: bool, normed: int | None = None) -> int:
    """Bytes per token one RMSNorm keeps: the fp32 input, the normalised tensor, and (before a linear) its output.

    When the input is already fp32 the upcast is the input itself, which stays alive anyway as the residual stream.
    With frozen weights (LoRA) neither the norm's weight multiply nor the frozen linears after it need their inputs
    for a weight gradient, so only the fp32 upcast (for the input gradient) is kept."""
    if frozen:
        return FP32 * h
    out = prec.act * h if feeds_linear else 0
    return FP32 * h + (prec.residual if normed is None else normed) * h + out


def sliding_mask_alone(m: ModelSpec, mb: MicroBatch, attn: str) -> bool:
    """Whether the sliding-window layers get a 4-D mask where the batch itself needs none (`mb.masked` false: one
    unpadded row): transformers skips a mask only while the keys are fewer than the window (masking_utils.py
    `_ignore_causal_mask_sdpa`: `kv_length >= local_attention_size` keeps it; `create_sliding_window_causal_mask` passes
    `local_size=config.sliding_window`); a FlashAttention kernel takes the window itself."""
    return (not mb.masked and bool(m.sliding_layers) and mb.seq >= m.sliding_window
            and "flash" not in effective_attention(m, attn))


def layer_masked(m: ModelSpec, mb: MicroBatch, attn: str, layer: int) -> bool:
    """Whether layer `layer`'s attention gets a 4-D mask: the batch's (`mb.masked`), or its sliding window's."""
    return mb.masked or (layer in m.sliding_layers and sliding_mask_alone(m, mb, attn))


def _attention_saved(m: ModelSpec, mb: MicroBatch, prec: Precision, attn: str, frozen: bool = False,
                     masked: bool | None = None) -> int:
    """q, k, v, out and the fp32 logsumexp. With a mask (the batch's, or a sliding layer's: `layer_masked`),
    transformers' `use_gqa_in_sdpa` is false, so k and v are repeated to every head before SDPA
    (integrations/sdpa_attention.py), and SDPA turns the boolean mask into an additive [rows, 1, seq, seq] bias in the
    compute dtype that it keeps for backward (CUDA: memory-efficient kernel)."""
    q = m.num_attention_heads * m.head_dim
    kv = m.num_key_value_heads * m.head_dim
    masked = mb.masked if masked is None else masked
    attn = effective_attention(m, attn)
    eager = attn == "eager"
    repeated = (masked or eager) and m.num_key_value_heads != m.num_attention_heads
    kv_saved = q if repeated else kv
    per_token = prec.act * (2 * q + 2 * kv_saved) + LSE_BYTES * m.num_attention_heads
    if m.fused_qkv and not repeated:
        # Phi-3's v is a slice of the fused qkv_proj output: saving v keeps the whole [T, q + 2kv] storage alive
        per_token += prec.act * (q + kv)
    if m.rope_cat and not eager and not frozen:
        # GLM-4's apply_rotary_pos_emb (modeling_glm4.py) returns torch.cat([q_embed, q_pass], -1): q is contiguous per
        # head [b, h, s, d], so SDPA's output is too and the attention's `transpose(1, 2).contiguous()`
        # (integrations/sdpa_attention.py) copies it: o_proj keeps that copy for its weight gradient beside SDPA's
        # own saved output (Llama's rotated q keeps q_proj's [b, s, h, d] layout, and the copy is a no-op)
        per_token += prec.act * q
    if m.qk_norm:   # per-head RMSNorm on q and k before RoPE (Qwen3, Gemma3): fp32 input + normalised tensor
        # (frozen norm weights under LoRA: only the fp32 upcast, as for the layer norms)
        per_token += (FP32 + (0 if frozen else _normed_bytes(m, prec))) * (q + kv)
    total = per_token * mb.tokens
    if eager:
        # eager_attention_forward: softmax(dtype=fp32) keeps its fp32 output and the 16-bit probabilities are kept
        # by the product with v (under fp32 compute `.to(query.dtype)` returns the softmax output itself: one tensor);
        # Gemma2's tanh soft-capping keeps its output too. [rows, heads, seq, seq] each.
        per_score = FP32 + (prec.act if prec.act != FP32 else 0) + (prec.act if m.attn_logit_softcapping else 0)
        total += per_score * m.num_attention_heads * mb.rows * mb.seq * mb.seq
    elif masked:
        total += prec.act * mb.rows * mb.seq * mb.seq
    return total


def effective_attention(m: ModelSpec, attn: str) -> str:
    """The kernel transformers runs: Gemma2 (attention logit soft-capping) declares `_supports_sdpa = False` and
    runs eager whatever is asked (modeling_gemma2.py)."""
    return "eager" if m.attn_logit_softcapping else attn


def eager_scores_no_grad(m: ModelSpec, rows: int, seq: int, act: int, attn: str) -> int:
    """The widest instant of an eager attention outside autograd (a teacher's or reference model's pass), 0 for any
    other kernel. At `softmax(attn_weights, dim=-1, dtype=torch.float32)` (modeling_gemma2.py
    `eager_attention_forward`) three [rows, heads, seq, seq] tensors are alive: the masked scores in the compute
    dtype, the fp32 copy softmax makes of a 16-bit input (aten/src/ATen/native/SoftMax.cpp `softmax`: `input_.toType
    (dtype)` then `_softmax`; on CUDA only a Half input takes `half_to_float` without the copy, so fp16 is counted
    as bf16, one fp32 tensor high) and the fp32 output; beside them k and v repeated to every head (`repeat_kv`) and
    the eager masks in the compute dtype, the causal one and — where the model has sliding layers — the sliding one
    (masking_utils.py `eager_mask`, both built before the first layer)."""
    if effective_attention(m, attn) != "eager":
        return 0
    scores = m.num_attention_heads * rows * seq * seq * (act + FP32 + (FP32 if act != FP32 else 0))
    repeated = 2 * rows * seq * m.num_attention_heads * m.head_dim * act \
        if m.num_key_value_heads != m.num_attention_heads else 0
    masks = (2 if m.sliding_layers else 1) * act * rows * seq * seq
    return scores + repeated + masks


def own_pass_mask_bytes(mb: MicroBatch, m: ModelSpec, attn: str) -> int:
    """The boolean masks a no-grad pass (a teacher's, a reference's) builds for its own forward (`mask_bytes`); 0 for
    eager attention, whose float masks `eager_scores_no_grad` counts."""
    return 0 if effective_attention(m, attn) == "eager" else mask_bytes(mb, m, attn)


def mask_bytes(mb: MicroBatch, m: ModelSpec | None = None, attn: str = "sdpa") -> int:
    """The boolean 4-D masks [rows, 1, seq, seq] built once per forward and shared by the layers — or, for an
    unpadded row, the sliding layers' own (`sliding_mask_alone`). Padded rows of a model with full and sliding layers
    get both: the forward builds one mask per kind (e.g. modeling_gemma3.py `causal_mask_mapping`: masking_utils
    `create_causal_mask` and `create_sliding_window_causal_mask`), each materialized for SDPA and both kept for the
    recompute under checkpointing (estimator/LOG.md); a FlashAttention kernel takes the window itself, and eager
    attention (Gemma 2) is counted as one mask, as its traces hold."""
    if mb.masked:
        both = m is not None and 0 < len(m.sliding_layers) < m.num_hidden_layers \
            and effective_attention(m, attn) == "sdpa"
        return (2 if both else 1) * mb.rows * mb.seq * mb.seq
    if m is not None and sliding_mask_alone(m, mb, attn):
        return mb.rows * mb.seq * mb.seq
    return 0


def expert_bytes(prec: Precision) -> int:
    """Bytes per element of the routed experts' tensors (transformers/integrations/moe.py `grouped_mm_experts_forward`):
    torch's grouped matmul has no autocast kernel on any device (torch 2.13:
    `torch._C._dispatch_dump("aten::_grouped_mm")` lists no Autocast* key, where aten::mm lists AutocastCUDA), so it
    runs in its operands' dtype — the expert stacks' and the residual stream's, fp32 for fp32 weights under bf16/fp16
    autocast (traced: s6-55, Qwen1.5-MoE GRPO, holds its [tokens·k, I] gate product in fp32) — and in the compute
    dtype otherwise."""
    return prec.weight if prec.autocast else prec.act


def _mlp_saved(m: ModelSpec, mb: MicroBatch, prec: Precision, layer: int, frozen: bool) -> int:
    # gate out, act out, up out, and the product for down_proj's weight gradient (not kept when down_proj is frozen)
    tensors = (4 if m.gated_mlp else 2) - (1 if frozen else 0)
    if m.is_moe and layer >= m.num_dense_layers:
        routed = mb.tokens * m.num_experts_per_tok
        # [tokens·k, H] tensors of the routed experts (transformers/integrations/moe.py `grouped_mm_experts_forward`;
        # the per-expert loops of the eager experts keep the same): the experts' output, kept by its product with
        # the routing weights (`proj_out * sample_weights_g`) for the router's gradient, and — when the experts
        # train — the routed copy of the hidden states (`hidden_states[perm // num_top_k]`), kept by gate_up_proj's
        # grouped matmul for its weight gradient
        routed_hidden = (1 if frozen else 2) * m.hidden_size
        experts = routed * (tensors * m.moe_intermediate_size + routed_hidden) * expert_bytes(prec)
        router = mb.tokens * m.num_experts * FP32 * 2          # router logits (fp32 softmax in and out)
        shared = mb.tokens * tensors * m.shared_expert_intermediate_size * prec.act
        return experts + router + shared
    return mb.tokens * tensors * m.intermediate_size * prec.act


def autocast_weight_copies(layer_params: int, prec: Precision) -> int:
    """16-bit copies of one layer's fp32 weights that autocast caches and autograd keeps (torch autocast cache)."""
    return 2 * layer_params if prec.autocast else 0


def layer_saved(m: ModelSpec, mb: MicroBatch, prec: Precision, *, attn: str, layer: int, layer_params: int,
                lora: LoraLayout) -> dict[str, int]:
    """Everything one layer keeps for backward with checkpointing off, by term. With LoRA the base weights are
    frozen: linears keep no inputs for weight gradients; the adapters keep their own (LoraLayout)."""
    h = m.hidden_size
    frozen = lora.enabled
    normed = _normed_bytes(m, prec)
    norms = 2 * _norm_saved(h, prec, feeds_linear=True, frozen=frozen, normed=normed) * mb.tokens
    if m.norms_per_layer == 4:   # Gemma2/3 post-norms feed the residual add, not a linear
        norms += 2 * _norm_saved(h, prec, feeds_linear=False, frozen=frozen, normed=normed) * mb.tokens
    return {
        "norms": norms,
        "attention": _attention_saved(m, mb, prec, attn, frozen, masked=layer_masked(m, mb, attn, layer)),
        "mlp": _mlp_saved(m, mb, prec, layer, frozen) + lora_variants.trained_experts_saved(m, mb, prec, layer, lora),
        "autocast_weights": autocast_weight_copies(layer_params, prec),
        # o_proj's adapter keeps SDPA's own output unless the attention copies it first (eager, GLM-4's RoPE)
        "lora": lora.saved_per_layer(mb.tokens, prec) - (
            0 if effective_attention(m, attn) == "eager" or m.rope_cat else
            lora.saved_attention_output(mb.tokens, prec)),
    }


def post_mlp_norm_saved(m: ModelSpec, mb: MicroBatch, prec: Precision, frozen: bool) -> int:
    """What the sandwich norm after the MLP keeps (Gemma2/3 post_feedforward_layernorm, GLM-4 post_mlp_layernorm), 0
    without one: the layer's backward runs it first, so its saved tensors are freed before the MLP's backward starts
    (modeling_gemma2.py Gemma2DecoderLayer.forward, modeling_glm4.py Glm4DecoderLayer.forward: the norm's output is
    the residual add's last input)."""
    if m.norms_per_layer != 4:
        return 0
    normed = _normed_bytes(m, prec)
    return _norm_saved(m.hidden_size, prec, feeds_linear=False, frozen=frozen, normed=normed) * mb.tokens


def checkpoint_bytes(m: ModelSpec, mb: MicroBatch, prec: Precision) -> int:
    """Full checkpointing (non-reentrant, TRL's default) keeps only each layer's input hidden state."""
    return prec.residual * m.hidden_size * mb.tokens


def sac_saved_attention(m: ModelSpec, mb: MicroBatch, prec: Precision, attn: str) -> int:
    """What TRL's selective checkpointing keeps of one layer besides its input: the outputs of the attention op
    (output + fp32 logsumexp). Its policy (trl/models/selective_activation_checkpointing.py `_build_policy_fn`)
    marks MUST_SAVE only the aten SDPA kernels and flash-attn's ops; eager attention (Gemma2 always) calls neither,
    so there selective checkpointing keeps what full checkpointing keeps."""
    if effective_attention(m, attn) == "eager":
        return 0
    q = m.num_attention_heads * m.head_dim
    return (prec.act * q + LSE_BYTES * m.num_attention_heads) * mb.tokens


def selective_bytes(m: ModelSpec, mb: MicroBatch, prec: Precision, attn: str) -> int:
    """TRL's selective checkpointing saves the attention op's outputs (`sac_saved_attention`) besides the layer input,
    and recomputes the rest."""
    return checkpoint_bytes(m, mb, prec) + sac_saved_attention(m, mb, prec, attn)


def backward_parts(m: ModelSpec, mb: MicroBatch, prec: Precision, attn: str) -> tuple[int, int, int]:
    """Gradients of one layer's intermediates alive during its backward: (hidden-state gradients, MLP backward
    gradients, attention backward gradients — eager score gradients or SDPA's dq/dk/dv + workspace). The MLP runs its
    backward first, while the whole layer's saved tensors are alive; by the attention's backward, the MLP's saved
    tensors are freed (autograd drops each once unpacked), which the caller accounts for."""
    inter = m.moe_intermediate_size * m.num_experts_per_tok if m.is_moe else m.intermediate_size
    mlp = mb.tokens * 2 * (expert_bytes(prec) if m.is_moe else prec.act) * inter
    q = m.num_attention_heads * m.head_dim
    kv = m.num_key_value_heads * m.head_dim
    if effective_attention(m, attn) == "eager":
        scores = (FP32 + prec.act) * m.num_attention_heads * mb.rows * mb.seq * mb.seq
    else:
        # SDPA backward: dq, dk, dv plus FlashAttention-2's workspace (flash_api.cpp mha_bwd: fp32 dq_accum, and
        # dk/dv expanded to every head under GQA)
        expanded = 2 * prec.act * q if kv != q else 0
        scores = mb.tokens * (prec.act * (q + 2 * kv) + FP32 * q + expanded)
    return mb.tokens * 2 * prec.residual * m.hidden_size, mlp, scores


def routing_weight_backward(m: ModelSpec, mb: MicroBatch, prec: Precision) -> int:
    """The routed experts' first backward instant beyond the layer's saved tensors, [tokens·k, H] three times
    (transformers/integrations/moe.py `grouped_mm_experts_forward`, backward order): the inverse permutation's
    gradient (`weighted_out[inv_perm]`: IndexBackward0 scatters into a zeros tensor of [tokens·k, H]), and the
    routing product's (`proj_out * sample_weights_g`: MulBackward0 writes proj_out's gradient and, for the routing
    weights', the product grad · proj_out before its sum over H). 0 for a dense model."""
    if not m.is_moe:
        return 0
    return 3 * mb.tokens * m.num_experts_per_tok * m.hidden_size * expert_bytes(prec)


def offload_kept_on_gpu(m: ModelSpec, mb: MicroBatch, prec: Precision, attn: str, lora: LoraLayout, layer: int) -> int:
    """What one layer leaves on the GPU under activation offloading without checkpointing: the storages saved twice.
    TRL's pack hook offloads a storage once; when the same storage is saved again while it is tracked, the new saved
    tensor is kept on the GPU as is ("Storage already offloaded - don't offload again, just track the reference":
    trl/models/activation_offloading.py `pack_tensor`), until the end of the backward. In a decoder layer: each
    RMSNorm's fp32 upcast (saved by `pow` and by the multiply with its rsqrt; the per-head q/k norms' too), and, where
    trained linears save their inputs, a norm output read by several linears (q/k/v, gate/up; under LoRA when lora_A
    saves the input itself: `LoraLayout.shared_input_groups`) and the attention output that SDPA saves and o_proj
    reads (one tensor: `LoraLayout.saved_attention_output`). The hook tracks a storage while it sits in the forward
    stash (the last five offloaded tensors): q/k/v's input is saved again in time unless a q/k norm's own saves come
    between q_proj's and k_proj's (`QK_NORM_BETWEEN_PROJECTIONS`; traced: Qwen3 offloads it twice, Llama and Gemma 3
    keep it)."""
    h, q, kv = m.hidden_size, m.num_attention_heads * m.head_dim, m.num_key_value_heads * m.head_dim
    per_token = FP32 * h * m.norms_per_layer + (FP32 * (q + kv) if m.qk_norm else 0)
    sdpa_output = effective_attention(m, attn) != "eager" and not m.rope_cat
    qkv_shared = not (m.fused_qkv or m.qk_norm and m.model_type in QK_NORM_BETWEEN_PROJECTIONS)
    if lora.enabled:
        groups = tuple(g for g in SHARED_INPUT if qkv_shared or "q_proj" not in g)
        per_token += lora.shared_input_groups(prec, groups)
        return per_token * mb.tokens + (lora.saved_attention_output(mb.tokens, prec) if sdpa_output else 0)
    moe = m.is_moe and layer >= m.num_dense_layers
    per_token += prec.act * h * (1 if qkv_shared else 0)                  # q/k/v read the input norm's output
    # gate/up read the post-attention norm's output; an MoE layer's router and shared expert do
    per_token += prec.act * h * ((1 if m.shared_expert_intermediate_size else 0) if moe else
                                 (1 if m.gated_mlp and not m.fused_gate_up else 0))
    per_token += prec.act * q if sdpa_output else 0
    return per_token * mb.tokens


def checkpoint_inputs_offloaded(t: TrainSpec) -> bool:
    """Activation offloading under full checkpointing: a layer's checkpoint inputs (torch/utils/checkpoint.py
    `_checkpoint_without_reentrant_generator`: `save_inputs` makes them saved tensors) are what the offload hooks pack;
    they are on the host when the backward reaches the layer. Selective checkpointing's cached outputs are no saved
    tensors (torch's `_CachedTorchDispatchMode` stores them itself) and keep the stash's cap."""
    return t.activation_offloading and t.gradient_checkpointing and not t.selective_checkpointing


def final_norm_restored(model_type: str, hidden_size: int, tokens: int, residual: int) -> int:
    """Activation offloading under full checkpointing: the saved tensor the final norm's backward brought back, alive
    through the last layer's backward — [tokens, H] at the type's width (hpcmem.models.final_norm: the fp32 input of
    an upcasting RMSNorm for most types; the traces that showed it: estimator/LOG.md)."""
    return restored_width(model_type, residual) * hidden_size * tokens


def offloaded_on_gpu(saved_tensors_bytes: list[int]) -> int:
    """Activation offloading (trl/models/activation_offloading.py) moves saved tensors ≥ 1 KiB to pinned CPU memory;
    while copies stream, up to 5 recent tensors stay on the GPU, and backward prefetches the next ones. The GPU
    keeps about the five largest tensors of a layer."""
    return sum(sorted(saved_tensors_bytes, reverse=True)[:5])

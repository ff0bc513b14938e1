"""LFM3-VL's tower and projector in a vision-language job (hpcmem.models.lfm3_vl), as hpcmem.estimate.vision's
`VisionTerms`, which `with_vision` places in the learned text part's phases (hpcmem.models.vlm_learned).

How the step runs (transformers 5.24 models/lfm3_vl/modeling_lfm3_vl.py `Lfm3VlModel.get_image_features`,
`Lfm3VlVisionModel.forward`): pixel_values [N, 3 · 2 · patch²] fp32 (no cast in get_image_features: under autocast
`patch_embed`, an nn.Linear, reads a 16-bit copy, kept for its weight gradient when it trains) → `embedding_norm`
(an RMSNorm over N rows, its output feeding the first layer's residual and operator_norm, not a linear) → the 2-D
rotary tables (fp32 cos and sin [N, head_dim], read by every attention layer) → `depth` `Lfm3VlVisionLayer`s (each a
GradientCheckpointingLayer: under checkpointing its input alone):
- a "full_attention" layer is a decoder layer at the tower's shape (hpcmem.estimate.vision `block_saved` on
  `block_spec`: RMSNorms, separate q/k/v_proj without biases, q_norm/k_norm over head_dim, grouped key/value heads,
  SDPA per image on the cu_seqlens splits whose concatenation out_proj keeps, the SwiGLU MLP w1/w3/w2);
- a "conv" layer (`Lfm3VlVisionShortConv.forward`) keeps, besides its two RMSNorms and the MLP (the same terms):
  in_proj's output [N, 3 · width] (the input and output gates and the conv input are chunks of it, which the two
  products keep), the permuted reshape's copy the depthwise Conv2d keeps as its input ([frames, width, H, W], N ·
  width; aten convolution keeps its input for the weight gradient whether or not the weight trains), the
  concatenation of the conv outputs that the output gate's product keeps (N · width), and out_proj's input (the
  product, N · width) when out_proj trains; under LoRA the adapters' own.
→ last_hidden_state (no final norm) → `Lfm3VlMultiModalProjector` on every patch: LayerNorm over the width
(`layer_norm_saved`; its output, reshaped to [N / merge², merge² · width], feeds linear_1) → linear_1 (→
projector_hidden_size) → GELU (keeps its input) → linear_2 (keeps GELU's output when it trains) → split per image into
`pooler_output` and `torch.cat` into the image tokens' rows (`masked_scatter`): the Qwen-tower models' image features
kept as forward locals while the language model runs (hpcmem.estimate.vision `feature_locals`).

Trained or frozen is what TRL and peft do: full fine-tuning trains the tower and the projector; LoRA all-linear adapts
every linear (the patch embedding too). The tower names its patch embedding as its input embeddings
(`Lfm3VlVisionModel._input_embed_layer = "patch_embed"`), which `enable_input_require_grads` hooks under
checkpointing with PEFT: its output and the token embeddings' output are leaves then.
"""

from __future__ import annotations

from dataclasses import replace

from hpcmem.estimate import activations as act
from hpcmem.estimate.lora import LoraLayout, backward_bytes_per_input
from hpcmem.estimate.states import optimizer_bytes_per_param
from hpcmem.estimate.vision import (FP32, VisionTerms, adapters_saved, block_saved, block_spec, feature_locals,
                                    graphless_tower, layer_norm_saved, token_leaf, tower_weights, unused_tower)
from hpcmem.job.image_rules import image_rows
from hpcmem.job.images import image_geometry
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import MicroBatch, Precision
from hpcmem.models.lfm3_vl import Lfm3VlTowerSpec


def _conv_operator_saved(v: Lfm3VlTowerSpec, n: int, prec: Precision, trained: bool) -> int:
    """What `Lfm3VlVisionShortConv.forward` keeps over n rows beyond the layer's norms and MLP: in_proj's output
    (3 · width), the Conv2d's input copy, the conv output's concatenation, out_proj's input when it trains."""
    return prec.act * v.hidden_size * n * (3 + 1 + 1 + (1 if trained else 0))


def lfm3_vl_terms(job: JobSpec, prec: Precision, lora: LoraLayout) -> VisionTerms:
    v: Lfm3VlTowerSpec = job.model.vision
    images, n = image_rows(job)
    adapted, _, weights = tower_weights(job, v, prec, lora)
    if images == 0:
        return unused_tower(weights)
    r, w, trained, gc = job.train.lora_r, prec.weight, not lora.enabled, job.train.gradient_checkpointing
    h = v.hidden_size
    pixels = n * v.patch_dim * FP32
    tokens = images * image_geometry(job.train, v).tokens
    if lora.enabled and not adapted and not gc:
        return graphless_tower(weights=weights, pixels=pixels, patches=n, image_tokens=tokens)
    gbytes = w if trained else lora.adapter_bytes
    adapted = list(adapted)
    layer_adapters = [x for x in adapted if x.part == "tower"]

    def adapter_params(kinds: list) -> int:
        return sum(r * (x.in_features + x.out_features) * x.count for x in kinds)

    trainable = v.num_params if trained else adapter_params(adapted)
    grads = trainable * gbytes
    opt = int(trainable * optimizer_bytes_per_param(job.train.optim, gbytes))
    # one layer of each kind at the tower's shape: the attention layer's q/k/v are three Linears without biases
    spec = replace(block_spec(v), fused_qkv=False, qkv_bias=False, o_bias=False, mlp_bias=False, qk_norm=True)
    mb = MicroBatch(rows=images, seq=n // images, label_tokens=0, padding_free=False, source="",
                    attn_implementation="sdpa")
    attn_adapters = tuple(x for x in adapted if not x.name.startswith("conv."))
    conv_adapters = tuple(x for x in adapted if not x.name.startswith("self_attn."))
    attention_full = block_saved(job, v, spec, mb, prec, v.attention_params, attn_adapters, lora)
    # the conv layer: the attention layer's norms and MLP (its attention terms and out_proj's input taken out), its
    # own operator's tensors, its adapters' own
    no_attention = act.layer_saved(spec, mb, prec, attn="sdpa", layer=0, layer_params=v.conv_params,
                                   lora=LoraLayout(enabled=False))
    if lora.enabled:
        frozen_terms = act.layer_saved(spec, mb, prec, attn="sdpa", layer=0, layer_params=v.conv_params,
                                       lora=LoraLayout(enabled=True, r=lora.r))
        no_attention = {**no_attention, "norms": frozen_terms["norms"], "mlp": frozen_terms["mlp"],
                        "autocast_weights": 0}
    conv_full = (no_attention["norms"] + no_attention["mlp"] + no_attention["autocast_weights"]
                 + _conv_operator_saved(v, n, prec, trained)
                 + adapters_saved([x for x in conv_adapters if x.part == "tower"], n, prec, lora))
    full = {"full_attention": attention_full, "conv": conv_full}
    if gc:
        blocks = (prec.residual * h * n,) * v.depth
    else:
        blocks = tuple(full[kind] for kind in v.layer_types)
    # before the layers: patch_embed's 16-bit input copy when it trains, embedding_norm (its output feeds the residual
    # and operator_norm, not a linear: the fp32 upcast and the normalised tensor), the rotary tables; frozen under
    # checkpointing, the hooked patch embedding's output and the token embeddings' output are leaves
    patch_in = n * v.patch_dim * prec.act if trained else 0
    emb_norm = n * h * (FP32 if lora.enabled else FP32 + prec.residual)
    rope = 2 * n * v.head_dim * FP32
    leaves = n * h * w + token_leaf(job, prec) if (not trained and gc) else 0
    embed_own = adapters_saved([x for x in adapted if x.part == "embed"], n, prec, lora)
    before = patch_in + emb_norm + rope + leaves + embed_own
    # the projector: its LayerNorm on every patch, GELU's input, linear_2's input when it trains, its adapters' own
    rows = n // v.merge_unit
    merger_saved = (layer_norm_saved(h, prec, frozen=not trained) * n
                    + prec.act * v.projector_hidden * rows * (2 if trained else 1)
                    + adapters_saved([x for x in adapted if x.part == "merger"], rows, prec, lora))
    saved = sum(blocks) + before + merger_saved
    hidden_t, mlp_t, scores_t = act.backward_parts(spec, mb, prec, "sdpa")
    # the conv layer's backward: the chunk's gradient, [N, 3 · width] assembled from the gates' and the conv input's,
    # beside the output gate's product gradient and the Conv2d's input gradient
    conv_t = prec.act * h * n * (3 + 2)
    adapter_t = n * max(x.in_features for x in layer_adapters) * backward_bytes_per_input(lora) \
        if layer_adapters else 0
    per_block = (v.block_params if trained else
                 max(adapter_params([x for x in layer_adapters if not x.name.startswith(other)]) // v.depth
                     for other in ("conv.", "self_attn."))) * gbytes
    merger_grads = ((v.merger_params if trained else adapter_params([x for x in adapted if x.part == "merger"]))
                    * gbytes)
    what = ("tower and projector trained (full fine-tuning)" if trained else
            f"frozen; LoRA on {len(adapted)} of its linear kinds")
    return VisionTerms(weights=weights, gradients=grads, optimizer=opt, pixels=pixels, saved=saved,
                       merger_saved=merger_saved, blocks_saved=blocks, block_full=max(full.values()),
                       block_backward=hidden_t + max(mlp_t + adapter_t if gc else max(mlp_t, adapter_t),
                                                     scores_t, conv_t),
                       block_grads=per_block, merger_grads=merger_grads, patches=n, image_tokens=tokens,
                       trained=what, forward_only=feature_locals(v, tokens, prec))

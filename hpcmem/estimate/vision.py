"""A vision-language SFT job's vision tower and patch merger: their states, the activations their forward keeps for
the backward, their backward, and the phases of the step that hold them.

How the step runs (transformers 5.24 modeling_qwen2_5_vl.py, TRL 1.16 SFTTrainer; traced, estimator/LOG.md):
`Qwen2_5_VLModel.forward` runs the tower on the micro-batch's pixel_values (N patch rows, N = images ×
patches per image, hpcmem.job.images) before the language model; the merger's output replaces the image tokens'
embeddings (`masked_scatter`), so the language model sees max_length tokens per row whatever share of them are image
tokens. The backward reaches the tower after the language model's layers; the token embedding's gradient comes last.
So the tower's saved activations sit under every language-model phase, its gradients under the closing phases, and
its own backward is a phase ("backward (vision tower)") on top of the language model's gradients.

Trained or frozen is what TRL and peft do, not a setting: full fine-tuning trains the tower and the merger (TRL 1.16
freezes nothing); LoRA freezes every base weight and adapts the tower's and merger's linears whose names the targets
reach (peft "all-linear": all of them). The tower builds a graph even when nothing in it trains:
`enable_input_require_grads` (modeling_utils.py), which TRL calls for PEFT under gradient checkpointing, hooks every
PreTrainedModel's input embeddings, and the tower's is its patch embedding (`_input_embed_layer = "patch_embed"`), so
its output requires grad and the tower keeps what its ops need for input gradients and runs a backward. Without
checkpointing nothing hooks it: a tower no adapter reaches builds no graph, an adapted one's graph starts at its
adapters. Qwen3-VL's tower names no `_input_embed_layer` (modeling_qwen3_vl.py `Qwen3VLVisionModel`), so its
`get_input_embeddings` finds none and the hook skips it: with or without checkpointing it is a tower nothing hooks
(`VisionSpec.hooked_input`; traced: q3vl-lora-qv-gc-896, no tower backward at all).

A block is a decoder layer of the tower's width over N rows (no mask: attention runs per window / per image on
cu_seqlens chunks), so its saved tensors are hpcmem.estimate.activations' terms for that shape, plus what differs
(`block_saved`); Qwen2-VL's and Qwen3-VL's LayerNorms and two-linear MLP replace the RMSNorm and gated-MLP terms
(`layer_norm_saved`, `fc_mlp_saved`).

Qwen3-VL's deepstack mergers (modeling_qwen3_vl.py `Qwen3VLVisionModel.forward`: after block i of
`deepstack_visual_indexes`, `deepstack_merger_list[j](hidden_states)`) are mergers outside the blocks, never
checkpointed: each keeps what the merger keeps (its LayerNorm over 4·width on N / merge² rows, `deepstack_saved`) from
the forward to the backward. The backward reaches merger j after block i + 1's and before block i's (its nodes were
made between theirs), so at block k's backward the mergers of blocks < k still hold their saved tensors and those of
blocks ≥ k have made their gradients (`_tower_backward`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from hpcmem.estimate import activations as act
from hpcmem.estimate.breakdown import Component, Phase
from hpcmem.estimate.lora import LORA_DROPOUT_MASK_BYTES, LoraLayout, backward_bytes_per_input
from hpcmem.estimate.names import BACKWARD, HEAD_BACKWARD, OPTIMIZER_STEP, OPTIMIZER_TEMPORARIES, is_forward
from hpcmem.estimate.names import ACTIVATIONS as LM_ACTIVATIONS
from hpcmem.estimate.names import GRADIENTS as LM_GRADIENTS
from hpcmem.estimate.states import optimizer_bytes_per_param
from hpcmem.estimate.trainers import NO_GRAD_PASS, REFERENCE_FORWARD, REFERENCE_MASK
from hpcmem.job.image_rules import image_rows
from hpcmem.job.images import image_geometry
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import MicroBatch, Precision, micro_batch
from hpcmem.job.trainers import entry
from hpcmem.models.peft_targets import ALL_LINEAR
from hpcmem.models.spec import ModelSpec
from hpcmem.models.vision_spec import VisionLinear, VisionSpec

FP32 = 4
# LayerNorm's per-row statistics it keeps for backward: fp32 mean and rstd (aten native_layer_norm)
LAYER_NORM_STATS = 2 * FP32
# Tensors of the MLP's width an fc1 → act → fc2 MLP keeps for backward, besides fc2's input: fc1's output (the
# activation's input), and for quick_gelu the sigmoid's output too (activations.py QuickGELUActivation: `input *
# torch.sigmoid(1.702 * input)`: sigmoid keeps its output, the product keeps both factors); GELU, exact or tanh
# (aten gelu), keeps its input alone. Keys: hpcmem.models.vision_spec.FC_ACTIVATIONS
ACT_TENSORS = {"quick_gelu": 2, "gelu": 1, "gelu_pytorch_tanh": 1}
# the tower families whose attention has three q/k/v Linears (`block_spec`)
SEPARATE_QKV = ("siglip", "qwen2_5_omni")
WEIGHTS = "vision tower weights"
OPTIMIZER = "vision tower optimizer states"
ACTIVATIONS = "vision activations"
GRADIENTS = "vision tower gradients"
VISION_BACKWARD = "backward (vision tower)"
CROSS_BACKWARD = "backward (cross-attention layer)"
CONNECTOR_BACKWARD = "backward (vision connector)"
CONNECTOR_FORWARD = "forward (vision connector)"
TOWER_FORWARD = "forward (vision tower)"
REFERENCE_CONNECTOR = "reference forward (vision connector)"
REFERENCE_VISION = "vision outputs (reference pass)"
EMBEDDING_BACKWARD = "backward (image token embedding)"


@dataclass(frozen=True)
class VisionTerms:
    """Bytes of the tower and merger for one job."""

    weights: int                 # base weights + vision adapters
    gradients: int
    optimizer: int
    pixels: int                  # the batch's pixel_values (fp32), alive the whole step
    saved: int                   # kept from the tower's forward until its backward (pixels excluded)
    merger_saved: int            # of `saved`, the merger's (freed when the backward reaches the blocks)
    blocks_saved: tuple[int, ...]    # of `saved`, per block (checkpoint inputs under checkpointing)
    block_full: int              # one block's saved tensors with nothing recomputed (the recompute under checkpointing)
    block_backward: int          # one block's backward temporaries beside its saved tensors
    block_grads: int             # gradients one block's backward creates
    merger_grads: int
    patches: int
    image_tokens: int
    trained: str                 # what trains, in words
    deepstack: tuple[tuple[int, int, int], ...] = ()   # per deepstack merger (block index, saved bytes, gradient bytes)
    forward_only: int = 0        # alive in the forward only: what the model's outputs hold (llava's unused layers)
    recomputes: bool = True      # its blocks are checkpointed under gradient checkpointing (Mllama's are not)
    # beyond the language model's worst layer backward while a decoder layer that reads the image states runs its
    # backward (Mllama's cross-attention layers), or 0
    cross_backward: int = 0
    # the token embedding's backward runs before the tower's (Mllama: the tower runs first in the forward, so its
    # nodes come last in the backward), so the tower's backward sees every language-model gradient
    embedding_first: bool = False
    # the tower's own no-grad pass in DPO's reference forward, beside the policy's saved tensors, when it outgrows the
    # tower's backward (what every block shares, as Pixtral's [1, 1, N, N] mask, and one block's widest instant); 0:
    # bounded by the tower's backward phase
    reference_pass: int = 0
    # a connector whose backward holds more than the blocks' (Idefics2's modality projection and perceiver): the
    # bytes beyond the tower's saved tensors at its worst instant (its own saved tensors, its backward's), or 0
    connector_backward: int = 0
    # its forward's worst instant beyond the tower's saved tensors (its saved tensors so far and what its forward holds
    # besides), before the language model's layers run, or 0; a tower without blocks (Emu3's VQ-VAE): its worst
    # instant beyond its saved and forward-only terms
    connector_forward: int = 0
    # a no-grad pass's worst instant in the connector (DPO's reference forward, after the policy's), or 0
    reference_connector: int = 0
    # the image path's tensors the reference model's own forward holds while its language model runs, in DPO's
    # reference forward (no grad: nothing saved, so every local its forward keeps); None: `forward_only`, the same
    # forward's locals, where the policy's pass saves none of them either
    reference_forward: int | None = None
    # the last block's forward instant beyond every block's saved tensors (what it holds besides), where that can
    # outgrow the language model's forward (an adapted fc2 without checkpointing), or 0
    block_forward: int = 0
    # per block, where blocks differ (DeepSeek-VL hybrid's SigLIP blocks, then its SAM tower's windowed and global
    # ones): each block's recompute, backward temporaries and gradients in place of block_full, block_backward and
    # block_grads, in blocks_saved's order; empty: every block alike
    blocks_full: tuple[int, ...] = ()
    blocks_backward: tuple[int, ...] = ()
    blocks_grads: tuple[int, ...] = ()
    # what the language model's layers keep for the image tokens beyond the text part's own terms, alive where the
    # tower's saved tensors are until the language model's backward is done (ERNIE-4.5-VL's vision experts,
    # hpcmem.estimate.vision_ernie4_5_vl_moe `routing_saved`; negative where the image tokens keep less), or 0
    text_saved: int = 0
    # image features added to the hidden states before a text layer (Granite 4 Vision's projectors): per feature (that
    # layer, its gradient's bytes); the gradient exists from the backward of that layer on and waits until the
    # backward reaches the image path, so the language model's "backward (layer k)" holds those of layers above k
    injected_grads: tuple[tuple[int, int], ...] = ()
    # the image tokens embedded by the token embedding itself (Apertus 1.5's codes): that second embedding call's
    # backward makes a dense gradient of the table while the first's waits to be summed with it, every other gradient
    # done — its bytes, or 0
    embedding_backward: int = 0


def vision_terms(job: JobSpec, prec: Precision, lora: LoraLayout, outside: Any = None) -> VisionTerms | None:
    """The Qwen towers' terms; `outside` replaces `outside_saved` for a tower of Qwen's blocks whose parts outside
    them differ (GLM-4.1V's, hpcmem.estimate.vision_glm4v)."""
    v = job.model.vision
    images, n = image_rows(job)
    if v is None:
        return None
    adapted = vision_adapters(job, v) if lora.enabled else ()
    w, trained = prec.weight, not lora.enabled
    adapter_params = sum(job.train.lora_r * (x.in_features + x.out_features) * x.count for x in adapted)
    weights = v.num_params * w + adapter_params * lora.adapter_bytes
    if images == 0:     # a text-only job: the tower's weights load, nothing in it gets a gradient
        return VisionTerms(weights=weights, gradients=0, optimizer=0, pixels=0, saved=0, merger_saved=0, blocks_saved=(),
                           block_full=0, block_backward=0, block_grads=0, merger_grads=0, patches=0,
                           image_tokens=0, trained="no images: unused")
    gc = job.train.gradient_checkpointing
    if lora.enabled and not adapted and not (gc and v.hooked_input):
        # TRL calls `enable_input_require_grads` for PEFT only under gradient checkpointing (dpo_trainer.py,
        # sft_trainer.py `__init__`), and it hooks the tower only where the tower names its patch embedding as its
        # input embeddings: without it and without adapters, nothing in the tower requires grad, so its forward builds
        # no graph, keeps nothing and runs no backward; the batch's pixel_values stay alive, and under checkpointing
        # the hooked token embeddings' output (`token_leaf`)
        return graphless_tower(weights=weights, pixels=n * v.patch_dim * FP32, patches=n,
                               image_tokens=images * image_geometry(job.train, v).tokens,
                               saved=token_leaf(job, prec) if gc else 0,
                               why="no checkpointing" if not gc else "nothing hooks its patch embedding")
    gbytes = w if trained else lora.adapter_bytes
    trainable = v.num_params if trained else adapter_params
    grads = trainable * gbytes
    opt = int(trainable * optimizer_bytes_per_param(job.train.optim, gbytes))
    spec = block_spec(v)
    mb = MicroBatch(rows=1, seq=n, label_tokens=0, padding_free=False, source="", attn_implementation="sdpa")
    block_params = (v.tower_params - v.embed_params) // v.depth
    block = block_saved(job, v, spec, mb, prec, block_params, adapted, lora)
    if v.family == "siglip" and trained:
        # SiglipAttention's out_proj reads SDPA's output itself (sdpa_attention_forward's `transpose(1, 2)
        # .contiguous()` of the kernel's [B, S, H, D] output copies nothing), not a concatenation as the Qwen
        # towers' `proj` does: block_saved's `proj_in` is that output, already counted with the attention
        block -= prec.act * v.hidden_size * mb.tokens
    if job.train.gradient_checkpointing:
        # each block is a GradientCheckpointingLayer: non-reentrant checkpointing keeps its input alone
        blocks = (prec.residual * v.hidden_size * n,) * v.depth
    else:
        blocks = (block,) * v.depth
    before, merger_saved = (outside or outside_saved)(job, v, n, prec, adapted, lora)
    ds_saved = deepstack_saved(v, n, prec, adapted, lora)
    ds_adapted = [x for x in adapted if x.part == "deepstack"]
    ds_grads = (v.deepstack_params // max(1, len(v.deepstack_visual_indexes)) if trained else sum(
        job.train.lora_r * (x.in_features + x.out_features) for x in ds_adapted)) * gbytes
    deepstack = tuple((i, ds_saved, ds_grads) for i in v.deepstack_visual_indexes)
    saved = sum(blocks) + before + merger_saved + ds_saved * len(deepstack)
    hidden_t, mlp_t, scores_t = act.backward_parts(spec, mb, prec, "sdpa")
    # the tower's adapters: the widest adapted input's gradient through lora_A, dropout and peft's cast
    # (hpcmem.estimate.lora.backward_transient, as for the decoder layers in hpcmem.estimate.step), beside the MLP's
    # backward for the MLP's adapters and beside the attention's for the attention's (SigLIP's q/k/v/out_proj, which
    # peft's q_proj/v_proj targets reach too: traced, g3-lora-qv-nogc-2img)
    # Without checkpointing SigLIP's MLP runs its adapters' backward and then its base path's (fc2's input gradient,
    # GELU's), one after the other (traced, g3-lora-all-nogc-1img: the fc2 adapter's 3 [N, intermediate] 16-bit
    # tensors, then the base path's 2); under checkpointing the block's recomputed forward makes the adapters' fp32
    # copies beside the block's recomputed tensors, which the sum bounds (g3-lora-all-gc-*)
    def adapter_t(mlp: bool) -> int:
        ins = [x.in_features for x in adapted if x.part == "tower" and x.name.startswith("mlp.") == mlp]
        return n * max(ins) * backward_bytes_per_input(lora) if ins and lora.enabled else 0
    per_block = (block_params if trained else sum(
        job.train.lora_r * (x.in_features + x.out_features) for x in adapted if x.part == "tower")) * gbytes
    merger = (v.merger_params if trained else sum(
        job.train.lora_r * (x.in_features + x.out_features) for x in adapted if x.part == "merger")) * gbytes
    what = ("tower and merger trained (full fine-tuning)" if trained else
            f"frozen; LoRA on {len(adapted)} of its linear kinds" if adapted else
            "frozen (no LoRA target reaches it); its backward still runs (input gradients)")
    image_tokens = job.train.profile_image_tokens or images * image_geometry(job.train, v).tokens
    return VisionTerms(weights=weights, gradients=grads, optimizer=opt, pixels=n * v.patch_dim * FP32, saved=saved,
                       merger_saved=merger_saved,
                       blocks_saved=blocks, block_full=block,
                       block_backward=hidden_t + max(mlp_t + adapter_t(True) if gc or v.family != "siglip" else
                                                     max(mlp_t, adapter_t(True)), scores_t + adapter_t(False)),
                       block_grads=per_block, merger_grads=merger, deepstack=deepstack, patches=n,
                       image_tokens=image_tokens, trained=what,
                       forward_only=0 if v.family == "siglip" else feature_locals(v, image_tokens, prec))


def feature_locals(v: VisionSpec, image_tokens: int, prec: Precision) -> int:
    """The image features the Qwen-tower models keep as locals of their forward while the language model runs, freed
    when it returns: the merger's output (split per image into `pooler_output`, views that keep it) and the
    `torch.cat` of those views cast to the token embeddings' dtype, which masked_scatter reads
    (modeling_qwen2_5_vl.py, modeling_qwen3_vl.py, modeling_glm4v.py `*Model.forward`); Qwen3-VL's deepstack mergers'
    outputs likewise, each with its `torch.cat` copy (`deepstack_visual_embeds`). Traced: Qwen3-VL RLOO LoRA without
    checkpointing at 896 px, 24.5 MiB each at the last decoder layer's forward. HyperCLOVAX Vision V2
    (modular_hyperclovax_vision_v2.py `HyperCLOVAXVisionV2Model.get_image_features`) splits its projector's output
    instead, of the text width (`VisionSpec.feature_width`): the merger's output is then no local but the projector's
    input (`outside_saved`)."""
    main = (prec.act + prec.weight) * v.feature_width * image_tokens
    return main + len(v.deepstack_visual_indexes) * 2 * prec.act * v.out_hidden_size * image_tokens


@lru_cache(maxsize=64)
def block_spec(v: VisionSpec) -> ModelSpec:
    """A vision block as the decoder layer hpcmem.estimate.activations sizes: the tower's width, heads and MLP, a
    fused qkv Linear (Qwen2_5_VLVisionAttention.qkv: q, k and v are views of one output; SigLIP's q/k/v_proj are
    three Linears, modeling_siglip.py SiglipAttention, and so are Qwen2.5-Omni's q/k/v, modeling_qwen2_5_omni.py
    Qwen2_5OmniVisionAttention), biases everywhere; q/k RMSNorms over the head dim where the tower has them
    (GLM-OCR's)."""
    return ModelSpec(name=f"{v.model_type} vision block", model_type=f"{v.model_type}_vision", vocab_size=1,
                     hidden_size=v.hidden_size, intermediate_size=v.block_mlp_width, num_hidden_layers=v.depth,
                     num_attention_heads=v.num_heads, num_key_value_heads=v.kv_heads,
                     head_dim=v.hidden_size // v.num_heads, tie_word_embeddings=False, hidden_act=v.hidden_act,
                     qkv_bias=True, o_bias=True, mlp_bias=True, fused_qkv=v.family not in SEPARATE_QKV,
                     gated_mlp=v.mlp == "gated", qk_norm=getattr(v, "qk_norm", False))


def block_saved(job: JobSpec, v: VisionSpec, spec: ModelSpec, mb: MicroBatch, prec: Precision, block_params: int,
                adapted: tuple[VisionLinear, ...], lora: LoraLayout) -> int:
    """What one block keeps with checkpointing off: the decoder-layer terms at the tower's shape (norms, fused-qkv
    attention, gated MLP, autocast copies), the adapters' own, and the concatenation of the per-chunk attention
    outputs that `proj` keeps for its weight gradient (Qwen2_5_VLVisionAttention.forward runs SDPA per cu_seqlens
    chunk and `torch.cat`s the outputs; each chunk's output stays saved by SDPA besides)."""
    frozen = lora.enabled
    no_lora = LoraLayout(enabled=False)
    terms = act.layer_saved(spec, mb, prec, attn="sdpa", layer=0, layer_params=block_params, lora=no_lora)
    if frozen:
        terms = {**terms, **{k: t for k, t in act.layer_saved(
            spec, mb, prec, attn="sdpa", layer=0, layer_params=block_params,
            lora=LoraLayout(enabled=True, r=lora.r)).items() if k in ("norms", "attention", "mlp")}}
        terms["autocast_weights"] = 0
    if v.norm == "layer":       # modeling_qwen2_vl.py Qwen2VLVisionBlock: norm1, norm2 are torch LayerNorms
        terms["norms"] = 2 * layer_norm_saved(v.hidden_size, prec, frozen) * mb.tokens
    if v.mlp == "fc":           # modeling_qwen2_vl.py VisionMlp
        terms["mlp"] = fc_mlp_saved(v, prec, frozen) * mb.tokens
    # the concatenation feeds `proj`: kept for its weight gradient when it trains; a frozen proj keeps nothing, and its
    # adapter keeps its own dropout output (`adapters_saved`), not its input
    proj_in = 0 if frozen else prec.act * v.hidden_size * mb.tokens
    own = adapters_saved([x for x in adapted if x.part == "tower"], mb.tokens, prec, lora)
    return sum(terms.values()) + proj_in + own + qkv_casts(v, spec, mb, prec, frozen)


def qkv_casts(v: VisionSpec, spec: ModelSpec, mb: MicroBatch, prec: Precision, frozen: bool) -> int:
    """The 16-bit copies of norm1's output beyond the one `layer_norm_saved` counts, where q, k and v are three
    Linears after a torch LayerNorm under autocast: layer_norm is on autocast's fp32 list (its output is fp32 whatever
    the weights' dtype), and each Linear casts that activation to the compute dtype itself — autocast's cast cache
    holds casts of leaf tensors that require grad only (aten/src/ATen/autocast_mode.cpp `cached_cast`), i.e. of
    trained weights, not activations — and keeps its own copy for its weight gradient when it trains
    (modeling_siglip.py SiglipAttention, modeling_clip.py CLIPAttention: `q_proj(hidden_states)`,
    `k_proj(hidden_states)`, `v_proj(hidden_states)`). A fused qkv Linear casts once; an RMSNorm returns its input's
    dtype (`hidden_states.to(input_dtype)`, modeling_qwen2_5_vl.py Qwen2RMSNorm), so its Linears share one tensor;
    frozen Linears keep no input (their adapters' casts are `adapters_saved`'s); without autocast the norm's output
    is itself the Linears' input."""
    if spec.fused_qkv or v.norm != "layer" or frozen or not prec.amp:
        return 0
    return 2 * prec.act * v.hidden_size * mb.tokens


def padding_mask_difference(prec: Precision, mb: MicroBatch, padded: bool, repeated: int = 0) -> int:
    """What a tower block keeps beyond the decoder-layer terms for its own padding mask: those terms count SDPA's
    additive bias [rows, 1, seq, seq] of the boolean mask, and k and v repeated to every head (`repeated`: the query
    width less the kv width, under GQA: transformers' `use_gqa_in_sdpa` is false with a mask), where several rows are
    (`MicroBatch.masked`); a tower padding its images to one row count gets a mask where a row is padded
    (`create_bidirectional_mask` returns none for an all-ones mask under SDPA): `padded`."""
    if padded == mb.masked:
        return 0
    bias = prec.act * (mb.rows * mb.seq * mb.seq + 2 * repeated * mb.tokens)
    return bias if padded else -bias


def layer_norm_saved(h: int, prec: Precision, frozen: bool) -> int:
    """Bytes per row one torch LayerNorm before a linear keeps: its input (cast to fp32 under autocast, where
    layer_norm is an fp32 op; else the input itself) and the fp32 mean and rstd (native_layer_norm's saved tensors,
    kept for the input gradient whether or not the weights train), and its output for the linear's weight gradient
    (in the compute dtype: autocast casts the fp32 output for the linear) when that linear trains."""
    return (FP32 if prec.amp else prec.residual) * h + LAYER_NORM_STATS + (0 if frozen else prec.act * h)


def fc_mlp_saved(v: VisionSpec, prec: Precision, frozen: bool) -> int:
    """Bytes per row a fc1 → act → fc2 MLP keeps (modeling_qwen2_vl.py VisionMlp.forward `fc2(act(fc1(x)))`): what
    the activation keeps of fc1's output (`ACT_TENSORS`) and fc2's input when fc2 trains (fc1's input is the norm's
    output, counted with the norm)."""
    return (ACT_TENSORS[v.hidden_act] + (0 if frozen else 1)) * v.intermediate_size * prec.act


def outside_saved(job: JobSpec, v: VisionSpec, n: int, prec: Precision, adapted: tuple[VisionLinear, ...],
                  lora: LoraLayout) -> tuple[int, int]:
    """(before the blocks, the merger's): what the tower keeps outside its blocks (Qwen2_5_VisionTransformerPretrainedModel.forward):
    - frozen: the patch embedding's output and the token embeddings' output, leaves of the graph (see below);
    - the patch embedding's Conv3d input, pixel_values cast to the weight dtype (`.to(dtype=target_dtype)`), kept
      for its weight gradient when it trains;
    - the rotary cos and sin, fp32 [N, head_dim] each after the window permutation, read by every block;
    - the merger: its RMSNorm over the tower width (fp32 upcast, normalised tensor, output for the first Linear;
      Qwen2-VL's LayerNorm `ln_q`: `layer_norm_saved`),
      the first Linear's output (GELU's input) and GELU's output (the second Linear's input), [N / merge², 4·width]
      each — the same bytes as [N, width]; frozen (LoRA), only the fp32 upcast and GELU's input;
    - the merger adapters' own under LoRA (a frozen linear keeps no input: its adapter keeps its dropout output);
    - HyperCLOVAX Vision V2's projector after the merger (modular_hyperclovax_vision_v2.py
      `HyperCLOVAXVisionV2Model.get_image_features`: `self.projector(vision_outputs.pooler_output)`): its input, the
      merger's output [N / merge², out_hidden_size], kept for its weight gradient when it trains; frozen, its adapter's
      own (counted with the merger's adapters, `VisionSpec.linears`)."""
    h, trained = v.hidden_size, not lora.enabled
    conv = n * v.patch_dim * prec.weight if trained else 0
    # frozen (LoRA): the patch embedding's output has no grad_fn, so `enable_input_require_grads`' hook makes it a leaf
    # that requires grad, which autograd's AccumulateGrad node keeps alive to the end of the backward; the token
    # embeddings' output likewise, and with images it is no longer the first layer's input (`masked_scatter` makes a
    # new one), so it is alive beside it (traced: qvl-lora-qv-gc-896, estimator/LOG.md); TRL installs the hook for PEFT
    # only under gradient checkpointing, so without it there are no such leaves
    hooked = not trained and job.train.gradient_checkpointing
    leaves = (n * h * prec.weight if v.hooked_input else 0) + token_leaf(job, prec) if hooked else 0
    if v.family == "siglip":
        return conv + leaves, siglip_head_saved(v, n, prec, trained)
    rope = 2 * n * (h // v.num_heads) * FP32
    if v.norm == "layer":       # modeling_qwen2_vl.py PatchMerger.ln_q
        norm = layer_norm_saved(h, prec, frozen=not trained) * n
    else:
        norm = (FP32 * h + (0 if not trained else prec.residual * h + prec.act * h)) * n
    mlp = prec.act * h * n + (prec.act * h * n if trained else 0)
    projector = prec.act * v.out_hidden_size * (n // v.merge_unit) if trained and v.projector_width else 0
    own = adapters_saved([x for x in adapted if x.part == "merger"], n // v.merge_unit, prec, lora)
    return conv + rope + leaves, norm + mlp + projector + own


def siglip_head_saved(v: VisionSpec, n: int, prec: Precision, trained: bool) -> int:
    """What Gemma 3's tower keeps after its layers (no rotary tables: SigLIP adds a learned position table once):
    post_layernorm (`layer_norm_saved`; its output feeds no linear), the projector's AvgPool2d input (the contiguous
    [images, width, side, side] copy of post_layernorm's output, which avg_pool2d keeps for its backward: fp32 under
    autocast, where layer_norm runs in fp32 and avg_pool2d is on no autocast list, else the weights' dtype), and on the
    pooled N / pool² rows Gemma3RMSNorm's fp32 input (its normalised fp32 tensor too when its weight trains) and the
    matmul's input (modeling_gemma3.py Gemma3MultiModalProjector.forward)."""
    h, rows = v.hidden_size, n // v.merge_unit
    post = (FP32 * h + LAYER_NORM_STATS) * n
    pooled = (FP32 * h + (FP32 * h if trained else 0) + prec.act * h) * rows
    pool_in = (FP32 if prec.amp else prec.weight) * h * n
    return post + pool_in + pooled


def token_leaf(job: JobSpec, prec: Precision) -> int:
    """The token embeddings' output that `enable_input_require_grads` makes a leaf (LoRA under checkpointing), alive
    beside the first layer's input that `masked_scatter` makes from it (`outside_saved`)."""
    return micro_batch(job).tokens * job.model.hidden_size * prec.weight


def deepstack_saved(v: VisionSpec, n: int, prec: Precision, adapted: tuple[VisionLinear, ...],
                    lora: LoraLayout) -> int:
    """What one deepstack merger keeps (modeling_qwen3_vl.py `Qwen3VLVisionPatchMerger.forward` with
    `use_postshuffle_norm=True`: `norm(x.view(-1, 4·width))`, then linear_fc1 → GELU → linear_fc2): its LayerNorm
    over the merged width on N / merge² rows (`layer_norm_saved`), linear_fc1's output (GELU's input) and, when
    linear_fc2 trains, GELU's output, and its adapters' own; 0 without deepstack mergers."""
    if not v.deepstack_visual_indexes:
        return 0
    rows, m, frozen = n // v.merge_unit, v.merged_width, lora.enabled
    norm = layer_norm_saved(m, prec, frozen) * rows
    mlp = prec.act * m * rows * (1 if frozen else 2)
    own = adapters_saved([x for x in adapted if x.part == "deepstack"], rows, prec, lora)
    return norm + mlp + own


def adapters_saved(adapted: list[VisionLinear], rows: int, prec: Precision, lora: LoraLayout) -> int:
    """peft's lora.Linear keeps the dropout mask, lora_A's input and lora_A's [rows, r] output
    (hpcmem.estimate.lora `LoraLayout.saved_per_layer`, per vision linear)."""
    mask = LORA_DROPOUT_MASK_BYTES if lora.dropout else 0
    a = prec.act if prec.amp else lora.adapter_bytes
    per_row = sum(x.in_features * (mask + a) + lora.r * a for x in adapted)
    return per_row * rows


def vision_adapters(job: JobSpec, v: VisionSpec) -> tuple[VisionLinear, ...]:
    """The tower's and merger's linears peft wraps: every one for "all-linear" (peft's `_maybe_include_all_linear_
    layers` leaves out only the output embedding), else those whose module name equals a target or ends in "." +
    target (peft/tuners/tuners_utils.py `check_target_module_exists`)."""
    targets = job.train.lora_target_modules
    if ALL_LINEAR in targets:
        return v.linears()
    return tuple(x for x in v.linears() if any(x.name == t or x.name.endswith("." + t) for t in targets))


def tower_weights(job: JobSpec, v: Any, prec: Precision, lora: LoraLayout) -> tuple[tuple[Any, ...], int, int]:
    """A CLIP/SigLIP-style tower's adapted linears (`vision_adapters`), their adapter parameters (r·(in + out) each,
    Hu et al. 2021) and the tower's weight bytes: its parameters in the weights' dtype plus the adapters in theirs."""
    adapted = vision_adapters(job, v) if lora.enabled else ()
    adapter_params = sum(job.train.lora_r * (x.in_features + x.out_features) * x.count for x in adapted)
    return adapted, adapter_params, v.num_params * prec.weight + adapter_params * lora.adapter_bytes


@dataclass(frozen=True)
class TowerStates:
    """What trains in a tower of `depth` equal blocks and its other parts (patch embedding, projector): the blocks'
    adapted linears, one block's and the rest's trainable parameters, the gradients' dtype bytes, the gradients' and
    the optimizer states' bytes."""

    layer_adapters: tuple[Any, ...]
    per_block: int
    rest: int
    gbytes: int
    grads: int
    opt: int


def tower_states(job: JobSpec, v: Any, prec: Precision, lora: LoraLayout, adapted: tuple[Any, ...]) -> TowerStates:
    """`TowerStates` of a tower whose spec names `block_params`, `depth` and `num_params`: everything trains when the
    tower trains whole (gradients in the weights' dtype), else the adapted linears' r·(in + out) each (Hu et al. 2021;
    gradients in the adapters' dtype); optimizer states per trainable parameter (hpcmem.estimate.states). A module
    no image runs (the spec's `idle_params`, its linears' part "idle") gets no gradient and so no optimizer state
    (torch/optim/adamw.py `_init_group` skips a parameter whose grad is None), trained or adapted."""
    r, trained = job.train.lora_r, not lora.enabled
    gbytes = prec.weight if trained else lora.adapter_bytes
    layer_adapters = tuple(x for x in adapted if x.part == "tower")
    others = [x for x in adapted if x.part not in ("tower", "idle")]
    per_block = v.block_params if trained else sum(r * (x.in_features + x.out_features) for x in layer_adapters)
    rest = (v.num_params - v.block_params * v.depth - getattr(v, "idle_params", 0)) if trained else \
        sum(r * (x.in_features + x.out_features) for x in others)
    trainable = per_block * v.depth + rest
    return TowerStates(layer_adapters=layer_adapters, per_block=per_block, rest=rest, gbytes=gbytes,
                       grads=trainable * gbytes,
                       opt=int(trainable * optimizer_bytes_per_param(job.train.optim, gbytes)))


def trained_parts(v: Any, tower_adapters: list[Any], merger_adapters: list[Any], r: int,
                  trained: bool) -> tuple[int, int]:
    """One encoder block's and the projector's trainable parameters: all of them when the tower trains whole, else
    their adapted linears' r·(in + out) each (Hu et al. 2021)."""
    if trained:
        return v.block_params, v.merger_params
    return (sum(r * (x.in_features + x.out_features) for x in tower_adapters),
            sum(r * (x.in_features + x.out_features) for x in merger_adapters))


def graphless_tower(*, weights: int, pixels: int, patches: int, image_tokens: int, saved: int = 0,
                    why: str = "no checkpointing", **extra: Any) -> VisionTerms:
    """The terms of a tower nothing in which requires grad (no LoRA target reaches it and no
    `enable_input_require_grads` hook: TRL installs it for PEFT under checkpointing only): its forward builds no
    graph and keeps nothing, it runs no backward; `pixels` (the batch's pixel_values) and `saved` (what outside its
    blocks still keeps) stay alive; `extra`: further VisionTerms fields a type's tower has."""
    return VisionTerms(weights=weights, gradients=0, optimizer=0, pixels=pixels, saved=saved, merger_saved=0,
                       blocks_saved=(), block_full=0, block_backward=0, block_grads=0, merger_grads=0, patches=patches,
                       image_tokens=image_tokens, trained=f"frozen (no LoRA target reaches it, {why}): no graph, no "
                                                          "backward", **extra)


def unused_tower(weights: int) -> VisionTerms:
    """The terms of a tower that sees no image in the job: its weights only."""
    return VisionTerms(weights=weights, gradients=0, optimizer=0, pixels=0, saved=0, merger_saved=0, blocks_saved=(),
                       block_full=0, block_backward=0, block_grads=0, merger_grads=0, patches=0, image_tokens=0,
                       trained="no images: unused")


def with_vision(job: JobSpec, terms: VisionTerms | None, phases: list[Phase], embed_grad: int) -> list[Phase]:
    """The phases with the tower's components added where they are alive, and the tower's own backward
    (`embed_grad`: the token embedding's gradient bytes, which the step makes after the tower's backward)."""
    if terms is None:
        return phases
    resident = (Component(name=WEIGHTS, bytes=terms.weights, note=terms.trained),
                *([Component(name=OPTIMIZER, bytes=terms.optimizer)] if terms.optimizer else []))
    if not terms.patches:
        return [Phase(name=p.name, components=(*resident, *p.components)) for p in phases]
    held = Component(name=ACTIVATIONS, bytes=terms.pixels + terms.saved + terms.text_saved,
                     note=f"{terms.patches:,} patches → {terms.image_tokens:,} image tokens; pixel_values fp32 "
                          f"{terms.pixels / 2**20:.1f} MiB" + (f"; the decoder's image-token routing "
                                                              f"{terms.text_saved / 2**20:+.1f} MiB"
                                                              if terms.text_saved else ""))
    grads = Component(name=GRADIENTS, bytes=terms.gradients)
    accumulating = job.train.gradient_accumulation_steps > 1
    pixels = Component(name="pixel_values", bytes=terms.pixels, note="the batch, fp32")
    out = []
    for p in phases:
        # DPO's reference forward runs after the policy's (dpo_trainer.py `_compute_loss`), its saved tensors alive; the
        # reference's own tower pass (no grad, one block's intermediates) is less than one block's recompute and
        # backward, so the tower's backward phase bounds it
        # (GRPO/RLOO score before the policy's forward: hpcmem.estimate.vision_rl)
        after_policy = p.name == REFERENCE_FORWARD and not entry(job.train.trainer).generates
        # the forward's phase: "forward", or a learned text part's "forward (layer k)" (hpcmem.estimate.learned
        # `_forward_phase`), where the tower has run and its saved tensors are alive alike
        if is_forward(p.name) or after_policy or p.name == HEAD_BACKWARD or \
                p.name.startswith("backward (layer"):
            # under gradient accumulation the tower's gradients of the earlier micro-batches are alive throughout
            extra: tuple[Component, ...] = (held, grads) if accumulating else (held,)
            if is_forward(p.name) and terms.forward_only:
                extra += (Component(name="vision outputs (forward only)", bytes=terms.forward_only,
                                    note="dropped with the model's outputs before the backward"),)
            if after_policy and terms.reference_pass:
                out.append(_reference_tower_pass(p, resident, extra, terms.reference_pass))
            # DPO's reference forward (trl/trainer/dpo_trainer.py `_compute_loss`, TRL 1.16): the policy's forward
            # first (line 1299), then the reference's under torch.no_grad() (lines 1327-1338), both before the
            # backward; precompute_ref_log_probs is refused for vision datasets (lines 764-769), so the reference
            # runs in every step. The policy's `outputs`, still referenced (lines 1531-1571), is the fused head's
            # FusedCausalLMOutput (trl/trainer/utils.py `add_fused_lm_head._fused_forward`, lines 1686-1695): per-token
            # fields only; the backbone's output that holds the image outputs (`backbone_outputs`, line 1616) is a
            # local freed when the policy's forward returns, so of the policy's image path only its saved tensors
            # (`held`) remain. The reference's own forward keeps its image path's locals through its language model
            reference_vision = terms.forward_only if terms.reference_forward is None else terms.reference_forward
            if after_policy and reference_vision:
                extra += (Component(name=REFERENCE_VISION, bytes=reference_vision,
                                    note="the reference forward's own image features, alive through its language "
                                         "model"),)
            layer = _backward_layer(p.name)
            waiting = sum(b for target, b in terms.injected_grads if layer is not None and target > layer)
            if waiting:
                extra += (Component(name="image feature gradients", bytes=waiting,
                                    note="of the features added above this layer, waiting for the image path's "
                                         "backward"),)
        elif p.name.startswith(BACKWARD) or p.name == OPTIMIZER_STEP:
            extra = (grads, pixels) if p.name != OPTIMIZER_STEP else (grads,)
        else:
            extra = ()
        out.append(Phase(name=p.name, components=(*resident, *p.components, *extra)))
    if terms.cross_backward:
        worst = max((p for p in out if p.name.startswith("backward (layer")),
                    key=lambda p: sum(c.bytes for c in p.components))
        out.append(Phase(name=CROSS_BACKWARD, components=(*worst.components, Component(
            name="cross-attention backward", bytes=terms.cross_backward,
            note="its attention over the image states: recomputed under checkpointing, and its gradients"))))
    if terms.blocks_saved:
        out.append(_tower_backward(job, terms, resident, phases, embed_grad))
    if terms.blocks_saved and terms.connector_backward:
        out.append(_connector_backward(terms, out[-1]))
    if terms.connector_forward:
        out.append(_forward_instant(terms, next(p for p in out if is_forward(p.name)), CONNECTOR_FORWARD,
                                    "vision connector forward", terms.connector_forward,
                                    "its saved tensors so far and its forward's own"))
    if terms.blocks_saved and terms.block_forward:
        out.append(_forward_instant(terms, next(p for p in out if is_forward(p.name)), TOWER_FORWARD,
                                    "vision block forward", terms.block_forward,
                                    "the last block's forward temporaries at fc2's adapter"))
    if terms.embedding_backward:
        out.append(_embedding_backward(terms, resident, phases))
    reference = next((p for p in out if p.name == REFERENCE_FORWARD and not entry(job.train.trainer).generates), None)
    if reference is not None and terms.reference_connector:
        # the reference's pass through the connector, before its language model: the policy's saved tensors beside it
        out.append(Phase(name=REFERENCE_CONNECTOR, components=(
            *(c for c in reference.components if not c.name.startswith("no-grad")
              and c.name not in (REFERENCE_MASK, REFERENCE_VISION)),
            Component(name="vision connector (no grad)", bytes=terms.reference_connector,
                      note="the reference's pass: its live tensors, nothing saved"))))
    return out


def _embedding_backward(terms: VisionTerms, resident: tuple[Component, ...], phases: list[Phase]) -> Phase:
    """The step's last backward when the image tokens are embedded by the token embedding (`VisionTerms.
    embedding_backward`): the optimizer step's residents and every gradient (no optimizer temporaries yet), the batch's
    pixel_values, and the second dense gradient of the embedding table beside the first."""
    closing = next(p for p in phases if p.name == OPTIMIZER_STEP)
    return Phase(name=EMBEDDING_BACKWARD, components=(
        *resident, *(c for c in closing.components if c.name != OPTIMIZER_TEMPORARIES),
        Component(name="pixel_values", bytes=terms.pixels, note="the batch, fp32"),
        Component(name="image token embedding gradient", bytes=terms.embedding_backward,
                  note="the table's dense gradient of the image tokens' lookup, before it is summed")))


def _backward_layer(name: str) -> int | None:
    """The decoder layer of a "backward (layer k)" phase, else None."""
    match = re.fullmatch(r"backward \(layer (\d+)\)", name)
    return int(match.group(1)) if match else None


def _reference_tower_pass(p: Phase, resident: tuple[Component, ...], extra: tuple[Component, ...],
                          tower_pass: int) -> Phase:
    """DPO's reference forward while its tower runs (dpo_trainer.py `_compute_loss`: the reference model's forward
    after the policy's, under no_grad): the policy's saved tensors, and the tower's no-grad pass in place of the
    language model's, which runs after it."""
    kept = tuple(c for c in p.components if c.name not in (NO_GRAD_PASS, REFERENCE_MASK))
    return Phase(name=f"{p.name} (vision tower)", components=(*resident, *kept, *extra, Component(
        name="vision no-grad pass", bytes=tower_pass, note="the reference's tower pass: the shared tensors and one "
                                                           "block's widest instant")))


def _forward_instant(terms: VisionTerms, forward: Phase, name: str, label: str, bytes_: int, note: str) -> Phase:
    """An instant of the image path's forward before the language model's layers (the connector's worst,
    `VisionTerms.connector_forward`; the last block's, `VisionTerms.block_forward`): the forward phase without the
    language model's saved tensors and its loss, the tower's saved tensors and the instant's own bytes."""
    keep = [c for c in forward.components if c.name not in (LM_ACTIVATIONS, ACTIVATIONS)
            and not c.name.startswith("loss")]
    outside = terms.saved - sum(terms.blocks_saved) - terms.merger_saved
    return Phase(name=name, components=(
        *keep,
        Component(name=ACTIVATIONS, bytes=terms.pixels + outside + sum(terms.blocks_saved),
                  note="every block, pixel_values, patch embedding input"),
        Component(name=label, bytes=bytes_, note=note)))


def _connector_backward(terms: VisionTerms, tower: Phase) -> Phase:
    """The connector's backward, before the tower's: the tower-backward phase's residents and language-model gradients,
    every block's saved tensors (or checkpoint inputs), the connector's own at its worst instant
    (`VisionTerms.connector_backward`) and its gradients."""
    keep = [c for c in tower.components if c.name not in (ACTIVATIONS, GRADIENTS, "vision backward temporaries")
            and not c.name.startswith("recompute")]
    outside = terms.saved - sum(terms.blocks_saved) - terms.merger_saved
    return Phase(name=CONNECTOR_BACKWARD, components=(
        *keep,
        Component(name=ACTIVATIONS, bytes=terms.pixels + outside + sum(terms.blocks_saved),
                  note="every block, pixel_values, patch embedding input"),
        Component(name=GRADIENTS, bytes=terms.merger_grads, note="the connector's"),
        Component(name="vision connector backward", bytes=terms.connector_backward,
                  note="its saved tensors and backward temporaries")))


def _tower_backward(job: JobSpec, terms: VisionTerms, resident: tuple[Component, ...],
                    phases: list[Phase], embed_grad: int) -> Phase:
    """The tower's backward, block D−1 down to 0: the language model's gradients (all but the token embedding's,
    which comes last) beside the blocks not yet done (their saved tensors), block k's recomputed tensors under
    checkpointing, its backward temporaries, and the gradients of the merger and blocks > k."""
    closing = next(p for p in phases if p.name == OPTIMIZER_STEP)
    deep_saved = sum(saved for _, saved, _ in terms.deepstack)
    lm = [Component(name=c.name, bytes=c.bytes - embed_grad, note="all but the token embedding's")
          if c.name == LM_GRADIENTS and not terms.embedding_first else c
          for c in closing.components if c.name != OPTIMIZER_TEMPORARIES]
    depth = len(terms.blocks_saved)
    outside = terms.saved - sum(terms.blocks_saved) - terms.merger_saved - deep_saved

    accumulating = job.train.gradient_accumulation_steps > 1

    gc = job.train.gradient_checkpointing and terms.recomputes
    fulls = terms.blocks_full or (terms.block_full,) * depth
    backwards = terms.blocks_backward or (terms.block_backward,) * depth
    block_grads = terms.blocks_grads or (terms.block_grads,) * depth

    def done(k: int) -> int:
        deep = sum(grads for i, _, grads in terms.deepstack if i >= k)
        return terms.gradients if accumulating else terms.merger_grads + sum(block_grads[k + 1:]) + deep

    def pending(k: int) -> int:     # the deepstack mergers of blocks < k, not yet reached
        return sum(saved for i, saved, _ in terms.deepstack if i < k)

    def instant(k: int) -> int:
        return sum(terms.blocks_saved[:k + 1]) + pending(k) + (fulls[k] if gc else 0) + backwards[k] + done(k)

    k = max(range(depth - 1, -1, -1), key=instant)
    recompute = fulls[k] if gc else 0
    return Phase(name=VISION_BACKWARD, components=(
        *resident, *lm,
        Component(name=ACTIVATIONS, bytes=terms.pixels + outside + sum(terms.blocks_saved[:k + 1]) + pending(k),
                  note=f"blocks ≤ {k}, pixel_values, patch embedding input, rotary tables"
                       + (f", deepstack mergers of blocks < {k}" if pending(k) else "")),
        *([Component(name="recompute (one vision block)", bytes=recompute)] if recompute else []),
        Component(name=GRADIENTS, bytes=done(k),
                  note="kept across gradient accumulation" if accumulating else
                  f"merger, blocks > {k}" + (f", deepstack mergers of blocks ≥ {k}" if terms.deepstack else "")),
        Component(name="vision backward temporaries", bytes=backwards[k])))


def images_note(job: JobSpec) -> str:
    """The images in words: how many per row, their size before and after the processor's resize, their tokens."""
    t = job.train
    if t.profile_images:
        return (f"images from the length profile: worst micro-batch {t.profile_images} image(s), "
                f"{t.profile_patches:,} patches, {t.profile_image_tokens:,} image tokens (within the rows' lengths)")
    g = image_geometry(t, job.model.vision)
    twice = " in each chosen and rejected row" if entry(t.trainer).rows_per_example > 1 else ""
    within = "max_prompt_length" if entry(t.trainer).generates else "max_length"     # GRPO/RLOO: in the prompt
    return (f"{t.images_per_example} image(s)/row{twice} {t.image_height}×{t.image_width} px → {g.resized[0]}×"
            f"{g.resized[1]} ({g.patches:,} patches, {g.tokens:,} image tokens each, within {within})")


def vision_json(job: JobSpec, terms: VisionTerms | None) -> dict | None:
    """The `--json` block of a vision-language job: the tower's size, the images' geometry, what trains."""
    v = job.model.vision
    if v is None or terms is None:
        return None
    out = {"model_type": v.model_type, "tower_params": v.tower_params, "merger_params": v.merger_params,
           "trained": terms.trained, "patches_per_micro_batch": terms.patches,
           "image_tokens_per_micro_batch": terms.image_tokens}
    if v.deepstack_visual_indexes:      # Qwen3-VL
        out.update(deepstack_merger_params=v.deepstack_params,
                   deepstack_visual_indexes=list(v.deepstack_visual_indexes))
    if job.train.profile_images:
        out.update(source="length profile", images_per_micro_batch=job.train.profile_images)
    elif job.train.images_per_example:
        g = image_geometry(job.train, v)
        out.update(images_per_example=job.train.images_per_example, resized=list(g.resized),
                   image_grid_thw=list(g.grid_thw), patches_per_image=g.patches, tokens_per_image=g.tokens)
    return out

"""Llama-3.2-Vision's tower, projector and cross-attention layers in a vision-language SFT job
(hpcmem.models.mllama): their states, what their forward keeps for the backward, and the tower's backward, as
hpcmem.estimate.vision's `VisionTerms`, which `with_vision` places in the step's phases.

How the step runs (transformers 5.24 models/mllama/modeling_mllama.py; traced, estimator/LOG.md):
`MllamaModel.forward` runs `MllamaVisionModel` on pixel_values [rows, images, max_num_tiles, 3, tile, tile] (every
image padded to max_num_tiles tiles), then `multi_modal_projector` on the concatenated outputs, then the language
model, whose cross-attention layers read the projector's output (`cross_attention_states`, [images · tiles ·
patches, text width]) as keys and values. The tower's encoder layers are plain nn.Modules, not
GradientCheckpointingLayers: checkpointing never reaches them, so every one of them keeps what its forward saved
until the tower's backward, with or without gradient checkpointing. The decoder's cross-attention layers are
GradientCheckpointingLayers like its self-attention layers.

What a tower layer keeps (`MllamaVisionEncoderLayer`: LayerNorm → q/k/v/o_proj without bias, SDPA over one image's
tiles × padded patches with the aspect-ratio mask → LayerNorm → fc1 → GELU → fc2) is a CLIP layer's
(hpcmem.estimate.vision `block_saved`, as for llava and SmolVLM) — under autocast its LayerNorms run in fp32, so the
tower's residual stream is fp32 — plus, in the gated global layers when the gates train, the two products
`gate.tanh() * hidden` keep their 16-bit operand. The aspect-ratio mask ([images, 1, tiles · padded patches,
tiles · padded patches] in the model dtype, `_prepare_aspect_ratio_attention_mask`) is one tensor every layer's SDPA
keeps.

A cross-attention layer (`MllamaCrossAttentionDecoderLayer`, `MllamaTextCrossAttention`) is counted by the language
model as a self-attention layer over the text; what it keeps beyond one (`cross_extra`) is its attention over the
image states: q_norm and k_norm (RMSNorm over the head dim: an fp32 copy, the normalised tensor when the weight
trains), k and v repeated to every head over the image rows (a mask is passed, so `use_gqa_in_sdpa` is false and
`repeat_kv` copies them, integrations/sdpa_attention.py), instead of the text's RoPE'd k and v, and with the gates
trained the two products' 16-bit operands. The projector's output and the cross-attention mask ([rows, 1, text,
image rows] in the model dtype, `_prepare_cross_attention_mask`) are alive from the forward to the last
cross-attention layer's backward (`shared`).
"""

from __future__ import annotations

from dataclasses import replace

from hpcmem.estimate import activations as act
from hpcmem.estimate.lora import LoraLayout, backward_bytes_per_input
from hpcmem.estimate.states import optimizer_bytes_per_param
from hpcmem.estimate.vision import (FP32, VisionTerms, adapters_saved, block_saved, block_spec, graphless_tower,
                                    layer_norm_saved, token_leaf, tower_weights, trained_parts, unused_tower)
from hpcmem.job.image_rules import image_rows
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import MicroBatch, Precision, micro_batch
from hpcmem.models.mllama import MllamaTowerSpec


def mllama_terms(job: JobSpec, prec: Precision, lora: LoraLayout) -> VisionTerms:
    v: MllamaTowerSpec = job.model.vision
    images, _ = image_rows(job)
    adapted, adapter_params, weights = tower_weights(job, v, prec, lora)
    r, w, trained = job.train.lora_r, prec.weight, not lora.enabled
    if images == 0:
        return unused_tower(weights)
    h, tiles = v.hidden_size, images * v.max_num_tiles
    n = tiles * v.padded_patches                # rows of every encoder layer
    m = tiles * v.patches                       # image states the projector and the cross-attention layers see
    pixels = tiles * (v.patches - 1) * v.patch_dim * FP32
    shared, cross = cross_terms(job, v, prec, lora, m)
    lm = job.model
    q = lm.num_attention_heads * lm.head_dim
    recompute = cross_extra(job, prec, trained, m) if job.train.gradient_checkpointing else 0
    cross_backward = recompute + prec.act * (2 * q + lm.hidden_size) * m
    if lora.enabled and not adapted and not job.train.gradient_checkpointing:
        # no adapter in the tower or the projector and no `enable_input_require_grads` hook (TRL installs it for PEFT
        # under checkpointing only): the tower builds no graph and runs no backward; the cross-attention layers still
        # keep their attention over the image states (the text side requires grad)
        return graphless_tower(weights=weights, pixels=pixels, patches=m, image_tokens=images, saved=shared + cross,
                               cross_backward=cross_backward, forward_only=FP32 * v.vision_output_dim * m)
    gbytes = w if trained else lora.adapter_bytes
    tower_adapters = [x for x in adapted if x.part == "tower"]
    merger_adapters = [x for x in adapted if x.part == "merger"]
    per_block, merger = trained_parts(v, tower_adapters, merger_adapters, r, trained)
    trainable = v.num_params if trained else adapter_params
    grads = trainable * gbytes
    opt = int(trainable * optimizer_bytes_per_param(job.train.optim, gbytes))
    spec = replace(block_spec(v), fused_qkv=False)
    # one row of all n encoder rows: what a layer keeps is per row (the shared aspect-ratio mask is `tower_mask`)
    mb = MicroBatch(rows=1, seq=n, label_tokens=0, padding_free=False, source="", attn_implementation="sdpa")
    # q/k/v_proj's own casts of the LayerNorm's fp32 output: block_saved's `qkv_casts`
    block = block_saved(job, v, spec, mb, prec, v.block_params, adapted, lora) - (prec.act * h * n if trained else 0)
    gated = 2 * prec.act * h * n if trained else 0          # gate_attn, gate_ffn products in a global layer
    blocks = (block,) * v.depth + (block + gated,) * v.global_depth
    # in the model's dtype (`_prepare_aspect_ratio_attention_mask(dtype=self.dtype)`), the weights'
    tower_mask = prec.weight * images * (v.max_num_tiles * v.padded_patches) ** 2
    # before the layers: the Conv2d's input in the weight dtype (trained), the hooked patch embedding's output and the
    # token embeddings' output (frozen under checkpointing: leaves), the tile-position table's output that the gated
    # product keeps (trained), layernorm_pre on the unpadded rows
    conv = tiles * (v.patches - 1) * v.patch_dim * w if trained else 0
    hooked = not trained and job.train.gradient_checkpointing
    leaves = tiles * (v.patches - 1) * h * w + token_leaf(job, prec) if hooked else 0
    tile_table = prec.act * h * m if trained else 0
    pre = layer_norm_saved(h, prec, frozen=True) * m
    # after them: layernorm_post, the projector's input (the fp32 concatenation cast for the Linear) when it trains,
    # its adapters' own
    post = layer_norm_saved(h, prec, frozen=True) * n
    proj_in = prec.act * v.vision_output_dim * m if trained else 0
    merger_saved = post + proj_in + adapters_saved(merger_adapters, m, prec, lora)
    saved = sum(blocks) + tower_mask + conv + leaves + tile_table + pre + merger_saved + shared + cross
    hidden_t, mlp_t, scores_t = act.backward_parts(spec, mb, prec, "sdpa")
    # the concatenation's backward hands each intermediate_layers_indices output its gradient (fp32, the residual
    # stream's dtype under autocast) at once; each waits for the backward to reach its layer
    pending = len(v.intermediate_layers) * FP32 * h * n
    adapter_t = n * max(x.in_features for x in tower_adapters) * backward_bytes_per_input(lora) \
        if tower_adapters else 0
    what = ("tower, projector and cross-attention layers trained (full fine-tuning)" if trained else
            f"frozen; LoRA on {len(adapted)} of its linear kinds")
    return VisionTerms(weights=weights, gradients=grads, optimizer=opt, pixels=pixels, saved=saved,
                       merger_saved=merger_saved + shared + cross, blocks_saved=blocks, block_full=block,
                       block_backward=hidden_t + max(mlp_t + adapter_t, scores_t) + pending,
                       block_grads=per_block * gbytes, merger_grads=merger * gbytes, patches=m,
                       image_tokens=images, trained=what, recomputes=False, cross_backward=cross_backward,
                       embedding_first=True, forward_only=FP32 * v.vision_output_dim * m)


def cross_terms(job: JobSpec, v: MllamaTowerSpec, prec: Precision, lora: LoraLayout, m: int) -> tuple[int, int]:
    """(shared, per-layer extras × cross-attention layers): the projector's output and the cross-attention mask,
    alive until the last cross-attention layer's backward; and, with checkpointing off, what each cross-attention
    layer keeps beyond the self-attention layer the language model counts in its place."""
    lm, mb, trained = job.model, micro_batch(job), not lora.enabled
    # the mask in the model's dtype (`_prepare_cross_attention_mask(dtype=self.dtype)`), the weights'
    shared = prec.act * lm.hidden_size * m + prec.weight * mb.seq * m
    if job.train.gradient_checkpointing:
        return shared, 0
    return shared, cross_extra(job, prec, trained, m) * len(v.cross_layers)


def cross_extra(job: JobSpec, prec: Precision, trained: bool, m: int) -> int:
    """One cross-attention layer's saved bytes beyond a self-attention layer's (the module docstring)."""
    lm, mb = job.model, micro_batch(job)
    q = lm.num_attention_heads * lm.head_dim
    kv = lm.num_key_value_heads * lm.head_dim
    normed = 0 if not trained else prec.act
    cross = ((FP32 + normed) * q + prec.act * 2 * q + act.LSE_BYTES * lm.num_attention_heads) * mb.tokens \
        + (FP32 + normed) * kv * m + prec.act * 2 * q * m
    gates = 2 * prec.act * lm.hidden_size * mb.tokens if trained else 0
    self_attn = act.layer_saved(lm, mb, prec, attn="sdpa", layer=0, layer_params=0,
                                lora=LoraLayout(enabled=not trained))["attention"]
    return cross + gates - self_attn

"""ERNIE-4.5-VL's tower and resampler in a vision-language job (hpcmem.models.ernie4_5_vl_moe), and what its MoE
decoder keeps for the image tokens beyond the learned text part's terms, as hpcmem.estimate.vision's `VisionTerms`,
which `with_vision` places in the learned text part's phases (hpcmem.models.vlm_learned).

How the step runs (transformers 5.24 models/ernie4_5_vl_moe/modeling_ernie4_5_vl_moe.py `Ernie4_5_VLMoeModel.
get_image_features`, `Ernie4_5_VLMoeVisionTransformerPretrainedModel.forward`): pixel_values [N, 3 · 14²] fp32 →
`patch_embed` (`Ernie4_5_VLMoePatchEmbed.forward`: `.to(self.proj.weight.dtype)`, a 16-bit copy that `proj`, an
nn.Linear, keeps for its weight gradient when it trains) → the axial rotary tables (fp32 cos and sin [N, head_dim],
read by every block's `apply_rotary_pos_emb_vision`) → `depth` `Ernie4_5_VLMoeVisionBlock`s (GradientCheckpointingLayers:
under checkpointing their input alone; else Qwen2-VL's block, hpcmem.estimate.vision `block_saved`: LayerNorms, the
fused qkv, SDPA per image on the cu_seqlens splits whose `torch.cat` proj keeps, fc1 → quick_gelu → fc2) → `ln` (a
LayerNorm whose output, viewed [N / 4, 4 · width], feeds spatial_linear.fc1: `layer_norm_saved`) →
`Ernie4_5_VLMoeVariableResolutionResamplerModel.forward` on T = N / 4 rows: spatial_linear (`Ernie4_5_VLMoeVisionMLP.
forward`: fc1 → GELU, which keeps its input → fc2, which keeps GELU's output when it trains → a LayerNorm over
4 · width whose output feeds no linear), `_temporal_slicing` (two index_selects of those rows, which keep their
indices only, concatenated to [T, 8 · width]: temporal_linear.fc1's input, its 16-bit cast kept when fc1 trains),
temporal_linear (the same MLP, its LayerNorm's output feeding `mlp`), `mlp` (Linear → text width, its input kept when
it trains), `after_norm` (`Ernie4_5_VLMoeRMSNorm.forward`: the fp32 upcast that pow and the product keep, and the
16-bit normalised tensor the weight's product keeps when the weight trains) → split per image into `pooler_output`,
whose `torch.cat` masked_scatter reads (hpcmem.estimate.vision `feature_locals`).

The decoder (`Ernie4_5_VLMoeMoeBlock.forward`): the processor's moe_mm_token_type_ids (1 on image tokens and on each
image's start and end markers, processing_ernie4_5_vl_moe.py `create_moe_mm_token_type_ids`) send those tokens to
`vision_moe`, experts of moe_intermediate_size[1] (512 by default) instead of the text experts' [0] (1536), in every
"sparse" layer; the learned text part was traced on text rows, every token through text_moe. What differs with
images, per sparse layer, without checkpointing:
- each routed (token, expert) pair of `Ernie4_5_VLMoeMoeExperts.forward`'s loop keeps tensors of the expert's width:
  the gate_up output [n, 2 · I] (silu's input and `up` are views of it), silu's output (the product keeps it) and,
  when the experts train, the product (down_proj's input) — 4 · I per pair when they train, 3 · I frozen (LoRA: peft's
  all-linear wraps nn.Linear only, not the fused expert parameters); an image token's k pairs are 512 wide, not
  1536;
- `hidden_states[~token_type_ids_states]` and `final_hidden_states[~token_type_ids_states] = ...` each evaluate
  `~token_type_ids_states`, a new boolean [rows, seq, hidden] tensor, which the index's and the index_put's backward
  keep as their indices (the vision side's masks are expanded views of a [rows, seq] tensor: nothing of the width).
- with the load-balancing loss on (TRL 1.16 turns it on where the text config's router_aux_loss_coef is not 0, its
  default 0.001: sft_trainer.py / dpo_trainer.py `aux_loss_enabled`, and the fused head asks the backbone for
  router logits, trl/trainer/utils.py `_fused_forward`), the block's router logits are the loss's: the assignment
  `router_logits[~token_type_ids_router] = ...` keeps its boolean [tokens, experts] mask as well (the [tokens,
  experts] fp32 logits themselves are the text rows' too).
The gathered rows are the experts' inputs, which keep their own as on a text row. Under
checkpointing a decoder layer keeps its input alone; its recompute, one layer at a time, is left to the learned
terms.

Trained or frozen is what TRL and peft do: full fine-tuning trains the tower and the resampler; LoRA all-linear adapts
every linear of the blocks, patch_embed.proj and the resampler's five. The tower names its patch embedding as its
input embeddings (`_input_embed_layer = "patch_embed"`); with its proj adapted its output requires grad anyway, and
under checkpointing with PEFT the token embeddings' output is the hooked leaf (`token_leaf`).
"""

from __future__ import annotations

from hpcmem.estimate import activations as act
from hpcmem.estimate.lora import LoraLayout, backward_bytes_per_input
from hpcmem.estimate.vision import (FP32, VisionTerms, adapters_saved, block_saved, block_spec, feature_locals,
                                    graphless_tower, layer_norm_saved, token_leaf, tower_states, tower_weights,
                                    unused_tower)
from hpcmem.job.image_rules import image_rows
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import MicroBatch, Precision, micro_batch
from hpcmem.models.ernie4_5_vl_moe import Ernie45VlTowerSpec

MARKERS_PER_IMAGE = 2       # <|IMAGE_START|> and <|IMAGE_END|>, routed to the vision experts with the image's tokens


def resampler_saved(v: Ernie45VlTowerSpec, n: int, prec: Precision, trained: bool, adapted: list,
                    lora: LoraLayout) -> int:
    """`ln` over the N rows and the resampler over N / 4 (see the module's text): the two MLPs' GELU inputs, their
    fc2 inputs when those train, their LayerNorms, temporal_linear.fc1's concatenated input when it trains, `mlp`'s
    input (the temporal LayerNorm's output) when it trains, after_norm's fp32 upcast and its normalised tensor when
    its weight trains, the adapters' own."""
    h, m, o, rows = v.hidden_size, v.merged_width, v.out_hidden_size, n // v.merge_unit
    ln = layer_norm_saved(h, prec, frozen=not trained) * n
    mlps = 2 * prec.act * m * rows * (2 if trained else 1)
    spatial_norm = layer_norm_saved(m, prec, frozen=True) * rows
    temporal_in = prec.act * v.temporal_width * rows if trained else 0
    temporal_norm = layer_norm_saved(m, prec, frozen=not trained) * rows
    after = (FP32 * o + (prec.act * o if trained else 0)) * rows
    own = adapters_saved([x for x in adapted if x.part == "merger"], rows, prec, lora)
    return ln + mlps + spatial_norm + temporal_in + temporal_norm + after + own


def routing_saved(job: JobSpec, v: Ernie45VlTowerSpec, images: int, image_tokens: int, prec: Precision,
                  trained: bool) -> int:
    """What the sparse decoder layers keep with images beyond the learned text part's terms, without checkpointing
    (see the module's text): per sparse layer, two boolean [rows, seq, hidden] masks, and per image-routed token its
    k expert pairs at the vision experts' width instead of the text experts' (negative: they are narrower); under the
    load-balancing loss the router's boolean [rows · seq, experts] mask too."""
    if job.train.gradient_checkpointing or not v.sparse_layers:
        return 0
    tokens = micro_batch(job).tokens
    routed = image_tokens + MARKERS_PER_IMAGE * images
    per_pair = (4 if trained else 3) * prec.act
    aux = job.train.router_aux_loss_coef if job.train.router_aux_loss_coef is not None else v.router_aux_loss_coef
    masks = 2 * tokens * v.out_hidden_size + (tokens * v.num_experts if aux else 0)
    narrower = routed * v.moe_k * per_pair * (v.vision_expert_width - v.text_expert_width)
    return v.sparse_layers * (masks + narrower)


def ernie45vl_terms(job: JobSpec, prec: Precision, lora: LoraLayout) -> VisionTerms:
    v: Ernie45VlTowerSpec = job.model.vision
    images, n = image_rows(job)
    adapted, _, weights = tower_weights(job, v, prec, lora)
    if images == 0:
        return unused_tower(weights)
    trained, gc = not lora.enabled, job.train.gradient_checkpointing
    h = v.hidden_size
    tokens = n // v.merge_unit
    pixels = n * v.patch_dim * FP32
    text = routing_saved(job, v, images, tokens, prec, trained)
    if lora.enabled and not adapted and not gc:
        return graphless_tower(weights=weights, pixels=pixels, patches=n, image_tokens=tokens, text_saved=text)
    st = tower_states(job, v, prec, lora, adapted)
    mb = MicroBatch(rows=images, seq=n // images, label_tokens=0, padding_free=False, source="",
                    attn_implementation="sdpa")
    spec = block_spec(v)
    full = block_saved(job, v, spec, mb, prec, v.block_params, tuple(adapted), lora)
    blocks = (prec.residual * h * n,) * v.depth if gc else (full,) * v.depth
    # before the blocks: patch_embed.proj's 16-bit input copy when it trains (its adapter's own otherwise), the rotary
    # cos and sin, and under checkpointing with PEFT the token embeddings' hooked output
    patch_in = n * v.patch_dim * prec.act if trained else 0
    embed_own = adapters_saved([x for x in adapted if x.part == "embed"], n, prec, lora)
    rope = 2 * n * (h // v.num_heads) * FP32
    leaves = token_leaf(job, prec) if not trained and gc else 0
    merger = resampler_saved(v, n, prec, trained, adapted, lora)
    saved = sum(blocks) + patch_in + embed_own + rope + leaves + merger
    hidden_t, mlp_t, scores_t = act.backward_parts(spec, mb, prec, "sdpa")
    adapter_t = n * max(x.in_features for x in st.layer_adapters) * backward_bytes_per_input(lora) \
        if st.layer_adapters else 0
    what = ("tower and resampler trained (full fine-tuning)" if trained else
            f"frozen; LoRA on {len(adapted)} of its linear kinds")
    return VisionTerms(weights=weights, gradients=st.grads, optimizer=st.opt, pixels=pixels, saved=saved,
                       merger_saved=merger, blocks_saved=blocks, block_full=full,
                       block_backward=hidden_t + max(mlp_t + adapter_t if gc else max(mlp_t, adapter_t), scores_t),
                       block_grads=st.per_block * st.gbytes, merger_grads=st.rest * st.gbytes, patches=n,
                       image_tokens=tokens, trained=what, forward_only=feature_locals(v, tokens, prec),
                       text_saved=text)

"""HunYuanVL's tower and patch merger in a vision-language job (hpcmem.models.hunyuan_vl), as hpcmem.estimate.vision's
`VisionTerms`, which `with_vision` places in the learned text part's phases (hpcmem.models.vlm_learned).

How the step runs (transformers 5.24 models/hunyuan_vl/modeling_hunyuan_vl.py `HunYuanVLModel.get_image_features`,
`HunYuanVLVisionTransformer.forward`): pixel_values [N, 3 · 16²] fp32 (every patch of every image one row) cast to the
tower's dtype (`pixel_values.to(vision_dtype)`: a 16-bit copy, which `patch_embedding`, an nn.Conv2d, keeps for its
weight gradient when it trains) → `HunYuanVLVisionPatchEmbed`: patch_embedding plus the position grid resized per
image (`interpolate_pos_encoding`: the table's fp32 copy, `F.interpolate(mode="bilinear")`, a copy back to 16 bits;
none of them kept for the backward) → the blocks (`HunYuanVLVisionBlock`, a GradientCheckpointingLayer: under
checkpointing its input alone; else SigLIP's shape: layer_norm1, q/k/v_proj as three Linears, SDPA per image on the
cu_seqlens splits whose outputs' `torch.cat` o_proj keeps, layer_norm2, fc1, exact gelu, fc2: hpcmem.estimate.vision
`block_saved`) → split per image, each through `HunYuanVLVisionPatchMerger` (`merger_saved`) → `torch.cat` of the
images' rows into `pooler_output`, split again per image, and `torch.cat` of those in `HunYuanVLModel.forward`, which
masked_scatter reads. The tower's last hidden states (`last_hidden_state`, kept by nothing: before_rms casts them to
fp32) and both concatenations are held by the model's output and the forward's locals until the trainer drops them:
forward-only.

Trained or frozen is what TRL and peft do: full fine-tuning trains the tower and the merger; LoRA all-linear adapts
every nn.Linear of the blocks and the merger's `mlp` (peft tuners_utils.py `_maybe_include_all_linear_layers`: the
three Conv2d are not nn.Linear). A Conv2d keeps its input for the backward whenever the graph reaches it, its weight
frozen or not (torch's `convolution` derivative is one formula over input and weight): the merger's two keep theirs
under LoRA too; `patch_embedding`'s input, pixel_values, needs no gradient, so frozen it keeps nothing.
HunYuanVLVisionTransformer names no input embeddings (its `get_input_embeddings` raises), so under checkpointing with
PEFT only the token embeddings' output is hooked (`enable_input_require_grads`).
"""

from __future__ import annotations

from dataclasses import replace

from hpcmem.estimate import activations as act
from hpcmem.estimate.lora import LORA_DROPOUT_MASK_BYTES, LoraLayout, backward_bytes_per_input
from hpcmem.estimate.vision import (FP32, VisionTerms, adapters_saved, block_saved, block_spec, feature_locals,
                                    graphless_tower, layer_norm_saved, token_leaf, tower_states, tower_weights,
                                    unused_tower)
from hpcmem.job.image_rules import image_rows
from hpcmem.job.images import image_geometry
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import MicroBatch, Precision, micro_batch
from hpcmem.models.hunyuan_vl import HunYuanVLTowerSpec
from hpcmem.models.peft_targets import ALL_LINEAR

QKV = ("q_proj", "k_proj", "v_proj")

# what HunYuanVLRMSNorm keeps per row besides its fp32 input: rsqrt's fp32 [rows, 1] output
RMS_STATS = FP32


def rms_norm_saved(width: int, prec: Precision, trained: bool) -> int:
    """Bytes per row of `HunYuanVLRMSNorm.forward`: the fp32 cast of its input (`hidden_states.to(torch.float32)`,
    kept by pow and the product), rsqrt's output, and, when its weight trains, the 16-bit normalised rows the
    `self.weight * ...` product keeps for the weight's gradient."""
    return FP32 * width + RMS_STATS + (prec.act * width if trained else 0)


def merger_saved(v: HunYuanVLTowerSpec, n: int, images: int, tokens: int, prec: Precision, trained: bool,
                 adapted: list, lora: LoraLayout) -> int:
    """What `HunYuanVLVisionPatchMerger.forward` keeps over the N patch rows of `images` images making `tokens` image
    rows (each image's merged rows with a newline column, then begin and end):
    - before_rms over the N rows (`rms_norm_saved`);
    - proj_conv's input, the [width, grid_h, grid_w] copy `reshape` makes of the permuted rows (16-bit), and proj_out's
      input, gelu's output [2 · width, N / 4], kept frozen or not (Conv2d); gelu's input [2 · width, N / 4];
    - mlp's input when it trains: the rows `torch.cat` with image_newline makes, permuted, copied contiguous by the
      matmul ([tokens − 2 per image, 4 · width]); its adapter's own under LoRA;
    - after_rms over the `tokens` rows of the text width (`rms_norm_saved`).
    HY-V4-VL's merger (modular_hy_v4_vl.py `HYV4VLVisionPatchMerger.forward`) has neither mlp nor after_rms: before_rms,
    proj_conv's input (the permuted view of before_rms's output, no copy: the same bytes), gelu's input and proj_out's
    input [width · 4, N / 4] each."""
    h, rows = v.hidden_size, n // v.merge_unit
    columns = tokens - v.extra_tokens * images
    before = rms_norm_saved(h, prec, trained) * n
    convs = prec.act * h * n + 2 * prec.act * v.conv_width * rows
    if not v.merger_linear:     # HY-V4-VL: proj_out's output, with its newline column, is the image rows
        return before + convs
    mlp_in = prec.act * v.merged_width * columns if trained else 0
    own = adapters_saved([x for x in adapted if x.part == "merger"], columns, prec, lora)
    after = rms_norm_saved(v.out_hidden_size, prec, trained) * tokens
    return before + convs + mlp_in + own + after


def _qkv_adapted(names: tuple[str, ...], targets: tuple[str, ...]) -> int:
    """How many of the decoder attention's `names` (q_proj, k_proj, v_proj) the LoRA targets reach (all-linear: every
    one; else a target equal to the name or ending in "." + it, peft's `check_target_module_exists`)."""
    return sum(1 for x in names if ALL_LINEAR in targets or any(x == t or t.endswith("." + x) for t in targets))


def first_block_difference(v: HunYuanVLTowerSpec, n: int, prec: Precision, lora: LoraLayout, adapted: tuple,
                           gc: bool) -> int:
    """What block 0 keeps less than the others under LoRA without checkpointing: its input, the embeddings' output,
    needs no gradient (patch_embedding frozen, pixel_values none, and nothing hooks the tower), so `layer_norm1`
    (frozen) keeps neither its fp32 input nor its statistics, and the dropouts before self_attn.q/k/v_proj's adapters
    keep no mask (modeling_hunyuan_vl.py `HunYuanVLVisionBlock.forward`, `HunYuanVLVisionAttention.forward`); from
    block 0's adapters on, every later tensor requires grad."""
    if not lora.enabled or gc:
        return 0
    qkv = sum(1 for x in adapted if x.part == "tower" and x.name in tuple(f"self_attn.{q}" for q in QKV))
    mask = LORA_DROPOUT_MASK_BYTES * v.hidden_size * qkv if lora.dropout else 0
    return (layer_norm_saved(v.hidden_size, prec, frozen=True) + mask) * n


def first_layer_input(job: JobSpec, prec: Precision, lora: LoraLayout, adapted: tuple) -> int:
    """What decoder layer 0 keeps only because its input requires grad, under LoRA without checkpointing when an
    adapter reaches the tower: the image rows `masked_scatter` writes into the token embeddings require grad, so layer
    0's input does, where a text-only step's (the frozen token embeddings' output, no `enable_input_require_grads`
    hook without checkpointing) does not, which the learned text profile was traced as (hpcmem.estimate.vision_fuyu
    `first_layer_input`, the same mechanism). modeling_hunyuan_vl.py `HunYuanVLDenseV1DecoderLayer.forward`:
    `input_layernorm` (HunYuanVLRMSNorm, frozen) then keeps its fp32 input and rsqrt's output (`rms_norm_saved`), and
    peft's dropout before each adapted self_attn.q/k/v_proj keeps its mask. Checkpointing hooks the token embeddings
    in both (the profile has it), full fine-tuning trains them (likewise). HunYuanVL's decoder layer only: HY-V4-VL's
    (hyper-connections, MLA) is not derived here, 0."""
    if not lora.enabled or not adapted or job.train.gradient_checkpointing or job.model.vision.family != "hunyuan_vl":
        return 0
    tokens, width = micro_batch(job).tokens, job.model.hidden_size
    qkv = _qkv_adapted(QKV, tuple(job.train.lora_target_modules))
    mask = LORA_DROPOUT_MASK_BYTES * width * qkv if lora.dropout else 0
    return (rms_norm_saved(width, prec, trained=False) + mask) * tokens


def hunyuan_vl_terms(job: JobSpec, prec: Precision, lora: LoraLayout) -> VisionTerms:
    v: HunYuanVLTowerSpec = job.model.vision
    images, n = image_rows(job)
    adapted, _, weights = tower_weights(job, v, prec, lora)
    if images == 0:
        return unused_tower(weights)
    trained, gc = not lora.enabled, job.train.gradient_checkpointing
    h = v.hidden_size
    tokens = job.train.profile_image_tokens or images * image_geometry(job.train, v).tokens
    pixels = n * v.patch_dim * FP32
    if lora.enabled and not adapted and not gc:
        return graphless_tower(weights=weights, pixels=pixels, patches=n, image_tokens=tokens)
    st = tower_states(job, v, prec, lora, adapted)
    # the blocks: q/k/v three Linears; each image one chunk of the cu_seqlens attention, whose outputs' concatenation
    # o_proj keeps (block_saved's `proj_in`)
    spec = replace(block_spec(v), fused_qkv=False)
    mb = MicroBatch(rows=images, seq=n // images, label_tokens=0, padding_free=False, source="",
                    attn_implementation="sdpa")
    full = block_saved(job, v, spec, mb, prec, v.block_params, tuple(adapted), lora)
    blocks = (prec.residual * h * n,) * v.depth if gc else \
        (full - first_block_difference(v, n, prec, lora, tuple(adapted), gc),) + (full,) * (v.depth - 1)
    # before the blocks: patch_embedding's 16-bit input copy when it trains; under checkpointing with PEFT the token
    # embeddings' hooked output
    patch_in = n * v.patch_dim * prec.act if trained else 0
    leaves = token_leaf(job, prec) if not trained and gc else 0
    merger = merger_saved(v, n, images, tokens, prec, trained, list(adapted), lora)
    saved = sum(blocks) + patch_in + leaves + merger + first_layer_input(job, prec, lora, tuple(adapted))
    hidden_t, mlp_t, scores_t = act.backward_parts(spec, mb, prec, "sdpa")
    adapter_t = n * max(x.in_features for x in st.layer_adapters) * backward_bytes_per_input(lora) \
        if st.layer_adapters else 0
    what = ("tower and merger trained (full fine-tuning)" if trained else
            f"frozen; LoRA on {len(adapted)} of its linear kinds")
    # the model's output holds last_hidden_state (the blocks' output) and pooler_output; the forward's locals the
    # concatenation masked_scatter reads
    forward_only = prec.residual * h * n + feature_locals(v, tokens, prec)
    return VisionTerms(weights=weights, gradients=st.grads, optimizer=st.opt, pixels=pixels, saved=saved,
                       merger_saved=merger, blocks_saved=blocks, block_full=full,
                       block_backward=hidden_t + max(mlp_t + adapter_t if gc else max(mlp_t, adapter_t), scores_t),
                       block_grads=st.per_block * st.gbytes, merger_grads=st.rest * st.gbytes, patches=n,
                       image_tokens=tokens, trained=what, forward_only=forward_only)

"""SmolVLM's / Idefics3's tower and connector in a vision-language SFT job (hpcmem.models.idefics3): their states,
what their forward keeps for the backward, and the tower's backward, as hpcmem.estimate.vision's `VisionTerms`, which
`with_vision` places in the step's phases as it does for the other towers.

How the step runs (transformers 5.24 models/smolvlm/modeling_smolvlm.py `SmolVLMModel.get_image_features`,
`SmolVLMVisionTransformer.forward`, `SmolVLMConnector.forward`): pixel_values [batch, tiles, 3, tile, tile] fp32 →
cast to the weight dtype and the real tiles gathered (`pixel_values[real_images_inds].contiguous()`: the Conv2d's
input) → the patch embedding, the position table added → `depth` encoder layers over [tiles, patches, width] (full
attention per tile) → `post_layernorm` → pixel_shuffle (a reshape copy to [tiles, patches / scale², width · scale²])
→ `modality_projection.proj` → the image tokens' embeddings (`masked_scatter`). Every layer and post_layernorm are on
the loss's path.

Trained or frozen is what TRL and peft do: full fine-tuning trains the tower and the connector; LoRA "all-linear"
adapts every q/k/v/out_proj, fc1, fc2 and the connector's proj. The tower's `get_input_embeddings` is its embeddings
module, which `enable_input_require_grads` hooks under checkpointing with PEFT: its output and the token embeddings'
output are leaves kept to the end of the backward (hpcmem.estimate.vision `outside_saved`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hpcmem.estimate import activations as act
from hpcmem.estimate.lora import LORA_DROPOUT_MASK_BYTES, LoraLayout, backward_bytes_per_input
from hpcmem.estimate.states import optimizer_bytes_per_param
from hpcmem.estimate.vision import (FP32, VisionTerms, adapters_saved, block_saved, block_spec, fc_mlp_saved,
                                    graphless_tower, layer_norm_saved, token_leaf, tower_weights, trained_parts,
                                    unused_tower)
from hpcmem.job.image_rules import image_rows
from hpcmem.job.images import image_geometry
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import MicroBatch, Precision
from hpcmem.models.idefics3 import Idefics3TowerSpec
from hpcmem.models.paligemma import PaliGemmaTowerSpec

INT64 = 8


@dataclass(frozen=True)
class Connector:
    """What a connector other than Idefics3's pixel-shuffle Linear and PaliGemma's Linear puts beside the shared
    SigLIP-style tower (Idefics2's: hpcmem.estimate.vision_idefics2): the batch's tensors, the Conv2d's saved input
    when it trains, what the connector keeps after post_layernorm's output (its own saved tensors and adapters'),
    its trainable parameters and its backward's and forward's worst instants beyond the tower's saved tensors."""

    pixels: int
    conv: int
    saved: int
    trainable: int
    backward: int
    forward: int
    reference: int = 0
    # alive beside every block's backward (Granite-Docling's deepstack taps' gradients, waiting for the blocks above
    # them: hpcmem.estimate.vision_granite_docling)
    waiting: int = 0


def idefics3_terms(job: JobSpec, prec: Precision, lora: LoraLayout, connector: Connector | None = None) -> VisionTerms:
    """SmolVLM's / Idefics3's terms, and PaliGemma's (hpcmem.models.paligemma): the same SigLIP layers over every
    image's patches, post_layernorm and one Linear to the text width (PaliGemmaMultiModalProjector reads
    post_layernorm's output itself, where SmolVLMConnector reads pixel_shuffle's copy of it: one [rows, width] tensor
    kept either way), without the pixel mask; DeepSeek-VL's (hpcmem.models.deepseek_vl) PaliGemma's with its
    two-linear aligner; Janus's (hpcmem.models.janus) DeepSeek-VL's, its idle generation parts weights only."""
    v: Idefics3TowerSpec | PaliGemmaTowerSpec = job.model.vision
    images, n = image_rows(job)             # n: the tower's rows, tiles × patches per tile
    adapted, adapter_params, weights = tower_weights(job, v, prec, lora)
    r, w, trained = job.train.lora_r, prec.weight, not lora.enabled
    if images == 0:
        return unused_tower(weights)
    h = v.hidden_size
    m = images * image_geometry(job.train, v).tokens            # connector rows, image tokens
    # the batch: pixel_values fp32 and, SmolVLM / Idefics3 only, pixel_attention_mask, int64 per pixel of every tile
    # (image_processing_pil_smolvlm.py `_make_pixel_mask`: np.int64), both alive the whole step
    mask = n // v.patches * v.tile ** 2 * INT64 if v.family == "idefics3" else 0
    pixels = n * v.patch_dim * FP32 + mask if connector is None else connector.pixels
    if lora.enabled and not adapted and not job.train.gradient_checkpointing:
        # no adapter in the tower or the connector and no `enable_input_require_grads` hook (TRL installs it for PEFT
        # under checkpointing only): nothing there requires grad, so it builds no graph and runs no backward
        return graphless_tower(weights=weights, pixels=pixels, patches=n, image_tokens=m)
    gbytes = w if trained else lora.adapter_bytes
    tower_adapters = [x for x in adapted if x.part == "tower"]
    merger_adapters = [x for x in adapted if x.part == "merger"]
    per_block, merger = trained_parts(v, tower_adapters, merger_adapters, r, trained)
    merger = merger if connector is None else connector.trainable
    outside = v.embed_params + 2 * h if trained else 0        # embeddings and post_layernorm
    trainable = outside + per_block * v.depth + merger
    grads = trainable * gbytes
    opt = int(trainable * optimizer_bytes_per_param(job.train.optim, gbytes))
    # SmolVLMVisionAttention's q, k, v are three Linears. No attention mask: every tile is tile × tile pixels, so the
    # patch mask is all ones and masking_utils.py `create_bidirectional_mask` (sdpa_mask with
    # allow_is_bidirectional_skip) returns None; attention runs per tile unmasked, which one row of tiles × patches
    # tokens sizes alike (no 4-D mask term)
    spec = replace(block_spec(v), fused_qkv=False)
    mb = MicroBatch(rows=1, seq=n, label_tokens=0, padding_free=False, source="", attn_implementation="sdpa")
    # trained under autocast, q_proj, k_proj and v_proj each keep their own cast of layer_norm1's fp32 output
    # (block_saved's `qkv_casts`)
    block = block_saved(job, v, spec, mb, prec, v.block_params, adapted, lora)
    if job.train.gradient_checkpointing:      # SmolVLMEncoderLayer is a GradientCheckpointingLayer: its input alone
        blocks = (prec.residual * h * n,) * v.depth
    elif trained:
        blocks = (block,) * v.depth
    else:
        # frozen without checkpointing, the first block's input requires no grad (frozen embeddings, no hook): its
        # first LayerNorm keeps nothing and the dropout before each q/k/v adapter no mask (autograd records no node
        # for an op none of whose inputs require grad); lora_A still keeps its input (traced: PaddleOCR-VL's block 0
        # keeps 30.7 MiB less than block 1 at 3,996 patches)
        on_norm = [x for x in tower_adapters if x.name.rsplit(".", 1)[-1] in ("q_proj", "k_proj", "v_proj")]
        masks = LORA_DROPOUT_MASK_BYTES * h * n * len(on_norm) if lora.dropout else 0
        first = block - layer_norm_saved(h, prec, frozen=True) * n - masks
        blocks = (first,) + (block,) * (v.depth - 1)
    # before the layers: the Conv2d's input (the gathered tiles in the weight dtype) for its weight gradient; frozen
    # under checkpointing, the hooked embeddings' output and the token embeddings' output are leaves
    conv = (n * v.patch_dim * w if trained else 0) if connector is None else connector.conv
    hooked = not trained and job.train.gradient_checkpointing
    leaves = token_leaf(job, prec) if hooked else 0
    # after them: post_layernorm (its output, reshaped by pixel_shuffle, is proj's input: kept when proj trains) and
    # the connector adapters' own
    merger_saved = layer_norm_saved(h, prec, frozen=not trained) * n + (
        adapters_saved(merger_adapters, m, prec, lora) if connector is None else connector.saved)
    if v.family in ("deepseek_vl", "janus", "deepseek_vl_hybrid"):
        # DeepSeek-VL's aligner (modeling_deepseek_vl.py DeepseekVLAligner.forward: linear2(GELU(linear1(x)))): GELU
        # keeps its input, linear1's [m, text width] output, and linear2 keeps GELU's output when it trains; Janus's
        # (modeling_janus.py JanusVisionAlignerMLP.forward) does so once per hidden layer after fc1; DeepSeek-VL
        # hybrid's (modular_deepseek_vl_hybrid.py DeepseekVLHybridAligner.forward: proj(GELU(concat(high_res_vision_proj
        # (..), vision_proj(..))))) keeps the concatenation for GELU and GELU's output for proj alike
        merger_saved += prec.act * v.out_hidden_size * m * (2 if trained else 1) * v.aligner_hidden_layers
    saved = sum(blocks) + conv + leaves + merger_saved
    # trained, the MLP's backward holds one [N, intermediate] gradient beside the block's saved tensors, not
    # backward_parts' two (a gated MLP's): fc2's input gradient, beside which GELU's backward writes its own once
    # fc2's backward has released fc2's saved input (autograd drops each saved tensor once unpacked;
    # torch/utils/checkpoint.py's unpack hook drops a recomputed one likewise). Under LoRA fc2's input gradient is the
    # sum of its frozen base path's and its adapter's (peft lora.Linear: base(x) + lora_B(lora_A(dropout(x)))), so two
    # are alive before GELU's backward, beside the adapters' own (`adapter_t`)
    hidden_t, mlp_t, scores_t = act.backward_parts(spec, mb, prec, "sdpa")

    def adapter_t(mlp: bool) -> int:
        """The widest adapted input's gradient through lora_A, dropout and peft's cast, beside the MLP's backward for
        the MLP's adapters and beside the attention's for the attention's (as hpcmem.estimate.vision does)."""
        ins = [x.in_features for x in tower_adapters if x.name.startswith("mlp.") == mlp]
        return n * max(ins) * backward_bytes_per_input(lora) if ins else 0
    # The block's backward instants beyond its saved tensors (recomputed, under checkpointing). The MLP's: the
    # gradient arriving at the block and the MLP's gradients (`mlp_t`), beside the adapters' (traced: GELU's backward
    # is the step's peak of SmolVLM with LoRA on q, v). The attention's: the two [N, h] gradients, SDPA's and the
    # attention adapters', once the MLP's saved tensors and the second norm's are freed (as hpcmem.estimate.step's
    # decoder layer). The recompute's, where fc2 has an adapter: at fc2's adapter everything the block saves exists
    # but fc2's, beside the arriving gradient, the residual and the MLP's input (layer_norm2's output: fp32 under
    # autocast) still held by the block's forward, fc2's input (GELU's output, no saved term of a frozen fc2) and its
    # base output, and peft's copy of its input in the adapters' dtype (`_cast_input_dtype`) with the dropout's
    # output made from it (traced: the step's peak of SmolVLM with LoRA on every linear, 487.5 MiB beyond the block's
    # 500 MiB at 13,312 patches)
    mlp_freed = (fc_mlp_saved(v, prec, not trained) + layer_norm_saved(h, prec, not trained)) * n + adapters_saved(
        [x for x in tower_adapters if x.name.startswith("mlp.")], n, prec, lora)
    # Without checkpointing the same instant comes in the last block's forward, beside every block's saved tensors:
    # the block's input (held by the encoder's loop) in place of the arriving gradient, and what the image path's
    # forward holds until the tower returns — the embeddings' output (the encoder's input, no saved tensor when nothing
    # before the blocks trains), the token embeddings' output (computed before the image features), and SmolVLM's /
    # Idefics3's copies of the real images and their pixel mask (modeling_smolvlm.py `get_image_features`:
    # `pixel_values[real_images_inds].contiguous()`) (traced: the step's peak of SmolVLM with LoRA on every linear
    # without checkpointing)
    fc2 = [x for x in tower_adapters if x.name == "mlp.fc2"]
    recompute_t = block_forward = 0
    if fc2:
        at_fc2 = n * h * (prec.residual + (FP32 if prec.amp else prec.act) + prec.act) + \
            n * fc2[0].in_features * (prec.act + lora.input_copy_bytes(prec) + lora.dropout_output_bytes(prec))
        if job.train.gradient_checkpointing:
            recompute_t = hidden_t // 2 + at_fc2
        else:
            # (Granite-Docling's likewise: modular_granite_docling.py `GraniteDoclingModel.get_image_features`,
            # `pixel_values[pixel_attention_mask].to(self.dtype)`, no pixel mask)
            copies = n * v.patch_dim * w + mask if v.family in ("idefics3", "granite_docling") else 0
            embeddings = n * h * prec.residual if v.depth > 1 else 0
            block_forward = n * h * prec.residual + at_fc2 + embeddings + token_leaf(job, prec) + copies
    what = ("tower and connector trained (full fine-tuning)" if trained else
            f"frozen; LoRA on {len(adapted)} of its linear kinds" if adapted else
            "frozen (no LoRA target reaches it); its backward still runs (input gradients)") + (
        "; the VQ model and generation embeddings/aligner/head loaded and idle (weights only)" if v.family == "janus"
        else "")
    return VisionTerms(weights=weights, gradients=grads, optimizer=opt, pixels=pixels, saved=saved,
                       merger_saved=merger_saved, blocks_saved=blocks, block_full=block,
                       block_backward=max(hidden_t // 2 + (mlp_t // 2 if trained else mlp_t) + adapter_t(True),
                                          hidden_t + scores_t + adapter_t(False) - mlp_freed, recompute_t) + (
                           connector.waiting if connector else 0),
                       block_grads=per_block * gbytes, merger_grads=merger * gbytes, patches=n, image_tokens=m,
                       trained=what, connector_backward=connector.backward if connector else 0,
                       connector_forward=connector.forward if connector else 0,
                       reference_connector=connector.reference if connector else 0, block_forward=block_forward)

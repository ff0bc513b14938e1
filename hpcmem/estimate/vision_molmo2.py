"""Molmo2's tower and adapter in a vision-language job (hpcmem.models.molmo2): Idefics3's SigLIP-layer terms
(hpcmem.estimate.vision_idefics3 `idefics3_terms`) with Molmo2's batch, no post_layernorm and its pooling adapter
(`connector`), as hpcmem.estimate.vision's `VisionTerms`, which `with_vision` places in the learned text part's
phases (hpcmem.models.vlm_learned).

How the step runs (transformers 5.24 models/molmo2/modeling_molmo2.py `Molmo2Model.get_image_features`,
`Molmo2VisionModel.forward`, `Molmo2Adapter.forward`): pixel_values [crops, P, 3 · 14²] fp32 cast to the tower's
dtype (`pixel_values.to(dtype=self.dtype)`: patch_embedding, an nn.Linear, keeps that copy for its weight gradient
when it trains, and its LoRA adapter its own), the whole position table added → `depth` encoder layers over [crops,
P, width] (SigLIP's shape: LayerNorms, q/k/v_proj as three Linears, SDPA per crop with no mask, o_proj, fc1 →
gelu_pytorch_tanh → fc2; GradientCheckpointingLayers) with no final norm; `capture_outputs` keeps every layer's
output in `hidden_states` (the embeddings' first), and the layers vision_feature_layer names are concatenated
(`torch.cat(..., dim=-1)`: [n, F · width], F of them, alive through the adapter's forward). The adapter, on the m image
tokens' pooling windows of k = pool_h · pool_w patches (`image_token_pooling`, int64 [m, k], the batch's):

- `flat_features[torch.clip(pooled_patches_idx, 0)]` (a gather: its backward keeps the int64 indices) times the
  window's validity mask (a [m, k, 1] tensor `mul` keeps), then the window's mean (`sum` and a division by the valid
  count, which keeps that [m, 1, 1] divisor): the query [m, F · width] and the keys' and values' input [m · k, F · width],
  each kept for q_proj's and k_proj's / v_proj's weight gradient when they train (under LoRA their adapters' own);
- `image_pooling_2d` (Molmo2VisionAttention): SDPA of one query over the window's k patches with the window's validity
  as a [m, 1, 1, k] boolean mask (`create_bidirectional_mask`): q [m, adapter width], k and v [m · k, adapter width],
  its output and fp32 logsumexp [m, heads] kept; o_proj's input, the contiguous copy of the output, when it trains;
- `image_projector`: gate_proj and up_proj over o_proj's output (kept when they train), SiLU's input (gate_proj's
  output), the product's two factors (SiLU's output, up_proj's output), down_proj's input (the product) when it
  trains: [m, intermediate_size] each;
- `pooled_features[valid_token_mask]` (a copy; its backward keeps the [m] boolean mask), split per image into
  `pooler_output`; `Molmo2Model.forward` `torch.cat`s those views into the features it adds to the image tokens'
  embeddings: two [m, text width] tensors held while the language model runs (hpcmem.estimate.vision
  `feature_locals`).

What the forward holds beyond the saved tensors until the model's outputs are dropped (`image_outputs`, returned in
`Molmo2CausalLMOutputWithPast`): the tower's hidden_states tuple — under checkpointing the layers' inputs are the
checkpoints' (counted), the last layer's output is not; without, every layer's output and the embeddings' (LayerNorm
under autocast keeps its own fp32 upcast, not these).

The backward: at the adapter's MLP the gradients of down_proj's input and of the product's two factors
[m, intermediate_size], beside the arriving [m, text width] one; then the gather's backward writes the concatenated
features' gradient [n, F · width], whose per-layer slices `torch.cat`'s backward hands on as views: the whole buffer
stays alive until the lowest feature layer's output takes its slice, beside the backward of every block above it
(`waiting`).

Trained or frozen is what TRL and peft do: full fine-tuning trains the tower and the adapter; LoRA all-linear adapts
every linear of the layers, patch_embedding and the adapter's seven. Neither Molmo2VisionModel nor Molmo2Adapter
exposes input embeddings (`get_input_embeddings` raises NotImplementedError, which `enable_input_require_grads`
skips), so under checkpointing with PEFT only the token embeddings' output is hooked.
"""

from __future__ import annotations

from dataclasses import replace

from hpcmem.estimate.lora import LoraLayout
from hpcmem.estimate.states import optimizer_bytes_per_param
from hpcmem.estimate.vision import (FP32, VisionTerms, adapters_saved, feature_locals, layer_norm_saved,
                                    vision_adapters)
from hpcmem.estimate.vision_idefics3 import Connector, idefics3_terms
from hpcmem.job.image_rules import image_rows
from hpcmem.job.images import image_geometry
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import Precision
from hpcmem.models.molmo2 import Molmo2TowerSpec

PREFIX = "image_pooling_2d.", "image_projector."
INT64 = 8


def connector(job: JobSpec, prec: Precision, lora: LoraLayout) -> tuple[Connector, int]:
    """Molmo2's Connector (the adapter, the module docstring) and the bytes the model's outputs hold through the
    forward (the tower's hidden_states tuple)."""
    v: Molmo2TowerSpec = job.model.vision
    images, n = image_rows(job)
    frozen, a, res = lora.enabled, prec.act, prec.residual
    h, fw, ha, i, t, k = (v.hidden_size, v.pooled_width, v.adapter_hidden, v.adapter_intermediate,
                          v.out_hidden_size, v.pool_unit)
    m = images * image_geometry(job.train, v).tokens         # image tokens: pooling windows, the adapter's rows
    # the batch: pixel_values fp32 and image_token_pooling int64 [m, k] (image_grids, image_num_crops: a few ints)
    pixels = n * v.patch_dim * FP32 + m * k * INT64
    conv = 0 if frozen else n * v.patch_dim * prec.weight
    adapted = {x.name: x for x in vision_adapters(job, v) if x.part == "merger"} if frozen else {}

    def own(names: tuple[str, ...], rows: int) -> int:
        return sum(adapters_saved([adapted[x]], rows, prec, lora) for x in names if x in adapted)
    # the gather's int64 indices, the validity mask `mul` keeps, SDPA's q, k, v, output and fp32 logsumexp, the
    # boolean mask, SiLU's input and the product's two factors
    pooling = m * k * INT64 + m * k * res + a * ha * (2 * m + 2 * m * k) + FP32 * m * v.adapter_heads + m * k
    mlp = 3 * a * i * m
    # trained: q_proj's input (the query), k_proj's / v_proj's (one tensor), o_proj's, gate_proj's / up_proj's (one
    # tensor), down_proj's (the product)
    inputs = 0 if frozen else a * fw * (m + m * k) + 2 * a * ha * m + a * i * m
    adapters = own(("image_pooling_2d.q_proj", "image_pooling_2d.o_proj", "image_projector.gate_proj",
                    "image_projector.up_proj", "image_projector.down_proj"), m) + \
        own(("image_pooling_2d.k_proj", "image_pooling_2d.v_proj"), m * k)
    saved = pooling + mlp + inputs + adapters
    trainable = v.merger_params if not frozen else sum(
        job.train.lora_r * (x.in_features + x.out_features) * x.count for x in adapted.values())
    gc = job.train.gradient_checkpointing
    held = (1 if gc else v.depth + 1) * res * h * n
    cat = res * fw * n
    # the MLP's backward: down_proj's input gradient and the product's factors' beside the arriving one
    backward = saved + 3 * a * i * m + a * t * m
    # the forward at down_proj: the concatenation alive, the product (frozen: a transient) and down_proj's output
    forward = saved + cat + (a * i * m if frozen else 0) + a * t * m
    # a no-grad pass (DPO's reference): the hidden states, the concatenation, the gathered and masked windows, the
    # MLP's three [m, intermediate_size] tensors
    reference = (v.depth + 1) * res * h * n + cat + 2 * a * fw * m * k + 3 * a * i * m
    lowest, top = v.feature_span
    waiting = res * h * n * (len(v.feature_layers) if top - lowest > 1 else len(v.feature_layers) - 1)
    return Connector(pixels=pixels, conv=conv, saved=saved, trainable=trainable, backward=backward, forward=forward,
                     reference=reference, waiting=waiting), held


def molmo2_terms(job: JobSpec, prec: Precision, lora: LoraLayout) -> VisionTerms:
    """Idefics3's tower terms with Molmo2's batch and adapter (`connector`), without idefics3_terms' post_layernorm;
    under LoRA the patch embedding's adapter (peft all-linear reaches it): its saved tensors and trainable parameters,
    and, without checkpointing, a first block whose input requires grad through it. A job without images only its
    weights."""
    if image_rows(job)[0] == 0:
        return idefics3_terms(job, prec, lora)
    v: Molmo2TowerSpec = job.model.vision
    conn, held = connector(job, prec, lora)
    terms = idefics3_terms(job, prec, lora, conn)
    if not terms.blocks_saved:      # graphless
        return replace(terms, forward_only=0)
    n = terms.patches
    post = layer_norm_saved(v.hidden_size, prec, lora.enabled) * n
    embed = [x for x in vision_adapters(job, v) if x.part == "embed"] if lora.enabled else []
    blocks = terms.blocks_saved
    extra = 0
    if embed:
        extra = adapters_saved(embed, n, prec, lora)
        if not job.train.gradient_checkpointing:
            blocks = (terms.block_full,) * v.depth
    saved = terms.saved - post + extra + sum(blocks) - sum(terms.blocks_saved)
    params = sum(job.train.lora_r * (x.in_features + x.out_features) for x in embed)
    gbytes = lora.adapter_bytes
    opt = int(params * optimizer_bytes_per_param(job.train.optim, gbytes))
    return replace(terms, saved=saved, merger_saved=terms.merger_saved - post, blocks_saved=blocks,
                   gradients=terms.gradients + params * gbytes, optimizer=terms.optimizer + opt,
                   merger_grads=terms.merger_grads + params * gbytes,
                   forward_only=held + feature_locals(v, terms.image_tokens, prec))

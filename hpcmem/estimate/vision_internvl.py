"""InternVL's tower and projector in a vision-language SFT job (hpcmem.models.internvl): llava's terms
(hpcmem.estimate.vision_llava `llava_terms`: a class-token tower over whole tiles, LayerNorms, separate q/k/v, an
fc1 → act → fc2 MLP, a feature layer whose class token is dropped, a two-linear projector) with what InternVL's layers
and projector keep beyond them.

How the step runs (transformers 5.24 models/internvl/modeling_internvl.py `InternVLModel.get_image_features`,
`InternVLVisionModel.forward`): pixel_values [tiles, 3, 448, 448] fp32 → cast to the weight dtype (the Conv2d's input)
→ `InternVLVisionEmbeddings`: the patch embedding, the class token concatenated, the position table added → `depth`
`InternVLVisionLayer`s over [tiles, 1025, width] → `layernorm` (nn.Identity under use_mean_pooling) → the feature
layer's output without its class token, reshaped to the 32 × 32 grid and `pixel_shuffle`d (two permute + contiguous
copies: their backward keeps nothing) → `InternVLMultiModalProjector`: LayerNorm over 4 · width → linear_1 → GELU →
linear_2 → the image tokens' embeddings (`masked_scatter`). Every layer is on the loss's path (feature layer -1).

Beyond llava's:
- the layer scale: `self.lambda_1 * attention_output` and `self.lambda_2 * layer_output` (InternVLVisionLayer.forward)
  are muls by a parameter: trained, each keeps its other operand (projection_layer's output, fc2's output, in the
  compute dtype) for the parameter's gradient; frozen, they keep only the parameter;
- no pre-norm (`pre_layrnorm`); the layers' outputs `capture_outputs` records (`select_hidden_states` asks for them
  with vision_feature_layer -1 as with llava's -2) are llava's forward-only term;
- the projector: its LayerNorm over 4 · width on the tiles' image-token rows (`layer_norm_saved`: its input, fp32
  stats, its output for linear_1 when linear_1 trains), GELU's input, linear_2's input when it trains, and the
  adapters' own (the slice of the feature layer's output is not a linear's input here).

Qianfan-OCR's tower (hpcmem.models.qianfan_ocr) is this one with a DropPath after each layer scale of every layer but
the first (models/qianfan_ocr/modeling_qianfan_ocr.py `QianfanOCRDropPath.forward`: `hidden_states.div(keep_prob) *
random_tensor`): the scalar div keeps nothing and the mul, its mask not requiring grad, keeps only the [tiles, 1, 1]
mask — one 512-byte block a DropPath, no term at this scale; its div output is a forward transient beside the layer
scale's output, below the step's peak.
"""

from __future__ import annotations

from dataclasses import replace

from hpcmem.estimate.lora import LoraLayout
from hpcmem.estimate.vision import VisionTerms, adapters_saved, layer_norm_saved, vision_adapters
from hpcmem.job.image_rules import image_rows
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import Precision
from hpcmem.models.internvl import InternVLTowerSpec


def internvl_terms(job: JobSpec, prec: Precision, lora: LoraLayout, base: VisionTerms) -> VisionTerms:
    """`base` (llava_terms of the same job) with InternVL's layer scale, projector and forward-only tensors."""
    v: InternVLTowerSpec = job.model.vision
    images, patches = image_rows(job)
    if images == 0 or not base.blocks_saved:
        return base
    trained, gc = not lora.enabled, job.train.gradient_checkpointing
    h, o = v.hidden_size, v.out_hidden_size
    tiles = patches // v.patches
    n, m = tiles * v.positions, tiles * v.tokens_per_image
    scale = 2 * prec.act * h * n if trained else 0          # lambda_1's and lambda_2's other operands
    block = base.block_full + scale
    blocks = base.blocks_saved if gc else (block,) * len(base.blocks_saved)
    merger_adapters = [x for x in vision_adapters(job, v) if x.part == "merger"] if lora.enabled else []
    own = adapters_saved(merger_adapters, m, prec, lora)
    merger_saved = (layer_norm_saved(v.merged_width, prec, frozen=not trained) * m
                    + prec.act * o * m * (2 if trained else 1) + own)
    saved = base.saved - sum(base.blocks_saved) + sum(blocks) - base.merger_saved + merger_saved
    # llava's forward-only tensors (the recorded hidden states, the layers past the feature layer), those layers'
    # layer-scale operands besides
    unused = v.depth - v.trained_layers
    return replace(base, saved=saved, merger_saved=merger_saved, blocks_saved=blocks, block_full=block,
                   forward_only=base.forward_only + (0 if gc else unused * scale))


"""PaddleOCR-VL's tower and projector in a vision-language job with images (hpcmem.models.paddleocr_vl), as
hpcmem.estimate.vision_idefics3's SigLIP-layer terms with PaddleOCR-VL's own outside the layers (`Connector`).

How the step runs (transformers 5.24 models/paddleocr_vl/modeling_paddleocr_vl.py `PaddleOCRVLModel.
get_image_features`, `PaddleOCRVisionTransformer.forward`): pixel_values [N, channels, patch, patch] fp32 → cast to the
weight dtype (the Conv2d's input) → the patch embedding, plus the position table resampled to each image's grid
(`PaddleOCRVisionEmbeddings.forward`: four table rows per patch times their bilinear weights, summed; the gathered rows
and the products are forward temporaries, and the table's gradient needs only the indices) → the rotary cos and sin
(fp32 [N, head_dim] each, read by every layer, so kept until the first layer's backward) → `depth` encoder layers
over [N, width] (VideoLLaMA3's: q/k/v/out_proj, SDPA per image over cu_seqlens chunks, `torch.cat` for out_proj) →
`post_layernorm` → the projector per image (`PaddleOCRProjector.forward`): `pre_norm` (a LayerNorm: its fp32 input
and statistics, and under autocast the compute-dtype cast of its output that a trained `linear_1` keeps, after the
2 × 2 merge's reshape), `linear_1` → GELU (its input kept) → `linear_2` (GELU's output kept when it trains) → the image
tokens' embeddings (`masked_scatter`). N patches, N / merge_size² image tokens.

Trained or frozen is what TRL and peft do: full fine-tuning trains the tower and the projector; LoRA "all-linear"
adapts every q/k/v/out_proj, fc1, fc2 and both projector linears. The tower names no input embeddings of its own, so
under checkpointing with PEFT only the token embeddings' output is hooked (hpcmem.estimate.vision `token_leaf`).
"""

from __future__ import annotations

from hpcmem.estimate.lora import LoraLayout
from hpcmem.estimate.vision import FP32, VisionTerms, adapters_saved, layer_norm_saved, tower_weights
from hpcmem.estimate.vision_idefics3 import Connector, idefics3_terms
from hpcmem.job.image_rules import image_rows
from hpcmem.job.images import image_geometry
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import Precision
from hpcmem.models.paddleocr_vl import PaddleOcrTowerSpec


def paddleocr_terms(job: JobSpec, prec: Precision, lora: LoraLayout) -> VisionTerms:
    """The shared SigLIP-layer terms (`idefics3_terms`) with PaddleOCR-VL's batch, embeddings, rotary tables and
    projector."""
    images, _ = image_rows(job)
    if images == 0:
        return idefics3_terms(job, prec, lora)
    return idefics3_terms(job, prec, lora, connector(job, prec, lora))


def connector(job: JobSpec, prec: Precision, lora: LoraLayout) -> Connector:
    """What PaddleOCR-VL keeps outside its encoder layers (see the module's docstring)."""
    v: PaddleOcrTowerSpec = job.model.vision
    images, n = image_rows(job)
    m = images * image_geometry(job.train, v).tokens
    adapted, _, _ = tower_weights(job, v, prec, lora)
    trained = not lora.enabled
    merger_adapters = [x for x in adapted if x.part == "merger"]
    rope = 2 * n * (v.hidden_size // v.num_heads) * FP32
    conv = n * v.patch_dim * prec.weight if trained else 0
    pre_norm = layer_norm_saved(v.hidden_size, prec, frozen=not trained) * n
    gelu = prec.act * v.merged_width * m * (2 if trained else 1)
    r = job.train.lora_r
    trainable = v.merger_params if trained else sum(r * (x.in_features + x.out_features) for x in merger_adapters)
    return Connector(pixels=n * v.patch_dim * FP32, conv=conv + rope,
                     saved=pre_norm + gelu + adapters_saved(merger_adapters, m, prec, lora), trainable=trainable,
                     backward=0, forward=0)

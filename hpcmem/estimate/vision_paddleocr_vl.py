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
from hpcmem.estimate.vision import VisionTerms, layer_norm_saved
from hpcmem.estimate.vision_video_llama_3 import navit_terms
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import Precision
from hpcmem.models.paddleocr_vl import PaddleOcrTowerSpec


def paddleocr_terms(job: JobSpec, prec: Precision, lora: LoraLayout) -> VisionTerms:
    """VideoLLaMA3's tower terms (hpcmem.estimate.vision_video_llama_3 `navit_terms`: the batch, the Conv2d's input,
    the rotary tables) with PaddleOCR-VL's projector."""
    return navit_terms(job, prec, lora, _projector_saved)


def _projector_saved(v: PaddleOcrTowerSpec, m: int, prec: Precision, trained: bool) -> int:
    """pre_norm on the N = m · merge² patch rows (its fp32 input and statistics, and the compute-dtype cast of its
    output a trained linear_1 keeps) and GELU's input, [m, merged width], and its output when linear_2 trains."""
    n = m * v.merge_unit
    return layer_norm_saved(v.hidden_size, prec, frozen=not trained) * n + \
        prec.act * v.merged_width * m * (2 if trained else 1)

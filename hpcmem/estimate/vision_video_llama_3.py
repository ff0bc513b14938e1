"""VideoLLaMA3's tower and projector in a vision-language SFT job with images (hpcmem.models.video_llama_3), as
hpcmem.estimate.vision_idefics3's SigLIP-layer terms with VideoLLaMA3's own outside the layers (`Connector`).

How the step runs (transformers 5.24 models/video_llama_3/modeling_video_llama_3.py `VideoLlama3Model.
get_image_features`, `VideoLlama3VisionModel.forward`): pixel_values [N, channels · patch²] fp32 → cast to the weight
dtype and viewed as [N, channels, patch, patch] (the Conv2d's input) → the patch embedding → the rotary cos and sin
(`VideoLlama3VisionRotaryEmbedding.forward`: fp32 [N, head_dim] each, read by every layer's
`apply_rotary_pos_emb_vision`, so kept until the first layer's backward) → `depth` encoder layers over [N, width]
(q/k/v/out_proj; SDPA per image over the cu_seqlens chunks, whose outputs `torch.cat` joins for out_proj, as the
Qwen towers' `proj` reads them) → `post_layernorm` → `pixel_unshuffle` (per image a bilinear resize by 1 / merge_size,
whose backward keeps no tensor, and a `torch.cat` of the images: a copy the projector's first Linear keeps when it
trains, the bytes hpcmem.estimate.vision `layer_norm_saved` counts for post_layernorm's output) → `projector.readout`
(Linear → nn.GELU → Linear: GELU keeps its input, readout.0's [tokens, text width] output, and readout.2 keeps GELU's
output when it trains) → the image tokens' embeddings (`masked_scatter`). With images merge_size is 1: N patches,
N image tokens.

Trained or frozen is what TRL and peft do: full fine-tuning trains the tower and the projector; LoRA "all-linear"
adapts every q/k/v/out_proj, fc1, fc2 and both readout linears. The tower's `get_input_embeddings` is its patch
embedding, which `enable_input_require_grads` hooks under checkpointing with PEFT (hpcmem.estimate.vision
`outside_saved`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hpcmem.estimate.lora import LoraLayout
from hpcmem.estimate.vision import FP32, VisionTerms, adapters_saved, tower_weights
from hpcmem.estimate.vision_idefics3 import Connector, idefics3_terms
from hpcmem.job.image_rules import image_rows
from hpcmem.job.images import image_geometry
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import Precision
from hpcmem.models.video_llama_3 import VideoLlama3TowerSpec


def video_llama_3_terms(job: JobSpec, prec: Precision, lora: LoraLayout) -> VisionTerms:
    """The shared SigLIP-layer terms (`idefics3_terms`) with VideoLLaMA3's batch, Conv2d input, rotary tables and
    projector."""
    return navit_terms(job, prec, lora, _aligner_saved)


def _aligner_saved(v: VideoLlama3TowerSpec, m: int, prec: Precision, trained: bool) -> int:
    """`projector.readout`: GELU keeps its input, readout.0's [tokens, text width] output, and readout.2 keeps GELU's
    output when it trains."""
    return prec.act * v.out_hidden_size * m * (2 if trained else 1)


def navit_terms(job: JobSpec, prec: Precision, lora: LoraLayout,
                projector_saved: Callable[[Any, int, Precision, bool], int]) -> VisionTerms:
    """`idefics3_terms` of a SigLIP-NaViT tower of VideoLLaMA3's layers (VideoLLaMA3's, PaddleOCR-VL's:
    hpcmem.estimate.vision_paddleocr_vl) with its `connector`; `projector_saved(tower, image tokens, precision,
    trained)` is what its projector keeps beyond its adapters."""
    images, _ = image_rows(job)
    if images == 0:
        return idefics3_terms(job, prec, lora)
    return idefics3_terms(job, prec, lora, connector(job, prec, lora, projector_saved))


def connector(job: JobSpec, prec: Precision, lora: LoraLayout,
              projector_saved: Callable[[Any, int, Precision, bool], int]) -> Connector:
    """What such a tower keeps outside its encoder layers (see the module's docstring): the batch, the Conv2d's input
    when it trains, the rotary tables, and the projector's saved tensors and adapters'."""
    v = job.model.vision
    images, n = image_rows(job)
    m = images * image_geometry(job.train, v).tokens
    adapted, _, _ = tower_weights(job, v, prec, lora)
    trained = not lora.enabled
    merger_adapters = [x for x in adapted if x.part == "merger"]
    rope = 2 * n * (v.hidden_size // v.num_heads) * FP32
    conv = n * v.patch_dim * prec.weight if trained else 0
    r = job.train.lora_r
    trainable = v.merger_params if trained else sum(r * (x.in_features + x.out_features) for x in merger_adapters)
    return Connector(pixels=n * v.patch_dim * FP32, conv=conv + rope,
                     saved=projector_saved(v, m, prec, trained) + adapters_saved(merger_adapters, m, prec, lora),
                     trainable=trainable, backward=0, forward=0)

"""Aya Vision's tower and projector in a vision-language SFT job (hpcmem.models.aya_vision): llava's terms
(hpcmem.estimate.vision_llava `llava_terms`: a SigLIP tower over whole tiles read at its last layer, as
LLaVA-OneVision's) with Aya Vision's projector in place of llava's.

The projector (transformers 5.24 models/aya_vision/modeling_aya_vision.py `AyaVisionMultiModalProjector.forward`):
`pixel_shuffle` (reshape and permute: a copy whose backward keeps nothing) → `layernorm` over 4 · width on the
tiles' image-token rows (`layer_norm_saved`: its input, fp32 stats, its output for linear_1 when linear_1 trains) →
linear_1 → `x, gate = hidden_states.chunk(2, dim=-1)` (two views of linear_1's output) → `silu(gate) * x`: SiLU keeps
its input, a view that keeps linear_1's whole [rows, alignment] output alive, and the product keeps both factors
(SiLU's new [rows, alignment / 2] output and x, a view of the same output) → linear_2 keeps its input (the product)
when it trains; the adapters' own (`adapters_saved`).

Cohere2Vision (hpcmem.models.cohere2_vision) is the same with its LayerNorm elsewhere: models/cohere2_vision/
modeling_cohere2_vision.py `Cohere2VisionModel.get_image_features` reads the tower's `last_hidden_state`, the output of
SiglipVisionModel's `post_layernorm` over the width on the tower's rows (`layer_norm_saved` there: its input, fp32
stats, its output for linear_1 when linear_1 trains: pixel_shuffle's copy, the same bytes), and
`Cohere2VisionMultiModalProjector.forward` runs pixel_shuffle → linear_1 → the same SwiGLU → linear_2 with no
LayerNorm of its own.
"""

from __future__ import annotations

from dataclasses import replace

from hpcmem.estimate.lora import LoraLayout
from hpcmem.estimate.vision import VisionTerms, adapters_saved, layer_norm_saved, vision_adapters
from hpcmem.job.image_rules import image_rows
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import Precision
from hpcmem.models.aya_vision import AyaVisionTowerSpec


def aya_terms(job: JobSpec, prec: Precision, lora: LoraLayout, base: VisionTerms) -> VisionTerms:
    """`base` (llava_terms of the same job) with Aya Vision's projector's saved tensors."""
    v: AyaVisionTowerSpec = job.model.vision
    images, patches = image_rows(job)
    if images == 0 or not base.blocks_saved:
        return base
    trained = not lora.enabled
    m = patches // v.patches * v.tokens_per_image            # the projector's rows: each tile's image tokens
    half = v.alignment // 2
    merger_adapters = [x for x in vision_adapters(job, v) if x.part == "merger"] if lora.enabled else []
    # the LayerNorm linear_1 reads: the projector's over 4 · width on its rows, or post_layernorm's over the width on
    # the tower's (`patches`)
    norm = layer_norm_saved(v.merged_width, prec, frozen=not trained) * m if v.projector_norm else \
        layer_norm_saved(v.hidden_size, prec, frozen=not trained) * patches
    merger_saved = (norm
                    + prec.act * m * (v.alignment + half + (half if trained else 0))
                    + adapters_saved(merger_adapters, m, prec, lora))
    return replace(base, saved=base.saved - base.merger_saved + merger_saved, merger_saved=merger_saved)

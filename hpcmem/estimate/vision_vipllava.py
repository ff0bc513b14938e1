"""ViP-LLaVA's tower and projector in a vision-language SFT job (hpcmem.models.vipllava): llava's terms
(hpcmem.estimate.vision_llava `llava_terms`) with its own projector.

How the step runs (transformers 5.24 models/vipllava/modular_vipllava.py `VipLlavaModel.get_image_features`): the CLIP
tower as llava's, every layer run, the layers up to the deepest feature layer on the loss's path (the spec's
`feature_layer`, so llava's trained layers, recorded hidden states and forward-only tail carry over); then
`hidden_states[k][:, 1:]` for each feature layer, `torch.cat` on the feature axis (cat's backward keeps nothing but
sizes, and the slices no longer feed a linear: llava's kept feature-layer output is not kept here) →
`VipLlavaMultiModalProjector`: `projector_layernorm` over layers × width (`layer_norm_saved`: its input — the
concatenation, or its fp32 cast under autocast — the fp32 stats, its output for linear_1 when linear_1 trains) →
linear_1 → GELU (its input) → linear_2 (its input when it trains) and the adapters' own — InternVL's projector terms
(hpcmem.estimate.vision_internvl) at the concatenated width.
"""

from __future__ import annotations

from dataclasses import replace

from hpcmem.estimate.lora import LoraLayout
from hpcmem.estimate.vision import VisionTerms, adapters_saved, layer_norm_saved, vision_adapters
from hpcmem.job.image_rules import image_rows
from hpcmem.job.jobspec import JobSpec
from hpcmem.job.shape import Precision
from hpcmem.models.vipllava import VipLlavaTowerSpec


def vipllava_terms(job: JobSpec, prec: Precision, lora: LoraLayout, base: VisionTerms) -> VisionTerms:
    """`base` (llava_terms of the same job) with ViP-LLaVA's projector's saved tensors in place of llava's."""
    v: VipLlavaTowerSpec = job.model.vision
    images, patches = image_rows(job)
    if images == 0 or not base.blocks_saved:
        return base
    trained = not lora.enabled
    m = patches // v.patches * v.tokens_per_image       # projector rows: the patches, class tokens dropped
    merger_adapters = [x for x in vision_adapters(job, v) if x.part == "merger"] if lora.enabled else []
    merger_saved = (layer_norm_saved(v.concat_width, prec, frozen=not trained) * m
                    + prec.act * v.out_hidden_size * m * (2 if trained else 1)
                    + adapters_saved(merger_adapters, m, prec, lora))
    return replace(base, saved=base.saved - base.merger_saved + merger_saved, merger_saved=merger_saved)

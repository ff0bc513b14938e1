"""MiniCPM-OCR (model_type "minicpm_ocr"): MiniCPM-V 4.6's tower spec at downsample_mode "4x" under its own model
type (transformers 5.24 models/minicpm_ocr/); everything but what differs is hpcmem.models.minicpmv4_6.

What differs from 4.6, read from modular_minicpm_ocr.py and configuration_minicpm_ocr.py:
- The config: `MiniCPMOcrConfig` keeps 4.6's sub-configs (text_config qwen3_5_text, vision_config
  `MiniCPMOcrVisionConfig` with 4.6's vision fields and defaults: width 768, MLP 3072, 12 layers, 16 px patches,
  insert_layer_id 6, window kernel 2 × 2) and merge fields, but defaults downsample_mode to "4x" and
  tie_word_embeddings to True.
- The model: `MiniCPMOcrModel(MiniCPMV4_6Model)` and `MiniCPMOcrForConditionalGeneration` add nothing, so at "4x"
  `get_image_features` runs the tower with `use_vit_merger=False`: insert_layer_id -1, every layer over all the
  patches, the window merger loaded and never run (its parameters get no gradient: no gradient buffer, no optimizer
  state, torch/optim/adamw.py `_init_group` skipping a parameter whose grad is None), then the MLP merger's one 2 × 2
  merge: one image token per 4 patches.
- The processor: `MiniCPMOcrImageProcessor(MiniCPMV4_6ImageProcessor)` (torchvision) at downsample_mode "4x":
  `find_best_resize` rounds sides to multiples of patch · 2 (merge_factor 2); with its class default
  small_image_upsize "always" its `_preprocess` resizes the source and slices as 4.6's does (the source upscaled when
  unsliced, the slices by `get_refine_size`). small_image_upsize "adaptive" picks each image's resolution from a glyph
  classifier over its pixels (`adaptive_upsize_resolution`, OpenCV): a geometry no setting fixes, refused.
  `MiniCPMOcrProcessor` writes 4.6's text around each image with patches / 4 image tokens per slice.
"""

from __future__ import annotations

from typing import Any

from hpcmem.errors import SpecError
from hpcmem.models.minicpmv4_6 import MiniCpmV46TowerSpec, minicpmv4_6_tower_from_config

# `MiniCPMOcrImageProcessor.small_image_upsize`'s class default, the only one whose geometry the image size decides
SMALL_IMAGE_UPSIZE = "always"


def minicpm_ocr_tower_from_config(cfg: dict[str, Any], name: str) -> MiniCpmV46TowerSpec:
    """The tower spec of a minicpm_ocr config.json dict: 4.6's fields, downsample_mode "4x" unless the dict names
    another; the family stays minicpmv4_6 (the same slices, geometry and estimate terms)."""
    upsize = cfg.get("small_image_upsize", SMALL_IMAGE_UPSIZE)
    if upsize != SMALL_IMAGE_UPSIZE:
        raise SpecError(f"model {name}: small_image_upsize {upsize!r} is not modelled: hpcmem models minicpm_ocr at "
                        f"{SMALL_IMAGE_UPSIZE!r} (MiniCPMOcrImageProcessor's default); 'adaptive' sizes each image "
                        "from a glyph classifier over its pixels, not from its size")
    return minicpmv4_6_tower_from_config(cfg, name, model_type="minicpm_ocr", downsample_default="4x")

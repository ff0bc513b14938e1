"""Qianfan-OCR's tower: InternVL's (hpcmem.models.internvl) under its own vision config class, as transformers 5.24
models/qianfan_ocr/modular_qianfan_ocr.py builds it.

- `QianfanOCRVisionConfig(InternVLVisionConfig)`: InternVL's fields with `attention_bias` True (q/k/v_proj with
  biases) and `drop_path_rate` 0.1 by default (configuration_qianfan_ocr.py).
- `QianfanOCRVisionModel(InternVLVisionModel)`: InternVL's embeddings and `layernorm`, its layers held as `layers`
  (not `encoder.layer`); `QianfanOCRVisionLayer(InternVLVisionLayer)`: InternVL's norms, attention, MLP and layer
  scale (lambda_1 and lambda_2 always parameters), with a `QianfanOCRDropPath` after each layer scale when the
  layer's rate — `torch.linspace(0, drop_path_rate, num_hidden_layers)`, the first layer's 0 — is above 0, else
  nn.Identity. The parameters are InternVL's.
- `QianfanOCRConfig(InternVLConfig)`: InternVL's outer fields (downsample_ratio 0.5, gelu projector, feature layer
  -1, "default"), a qwen3 text_config by default and tie_word_embeddings False; `QianfanOCRModel(InternVLModel)` and
  `QianfanOCRForConditionalGeneration(InternVLForConditionalGeneration)` run InternVL's forward.
- `QianfanOCRProcessor(InternVLProcessor)`: InternVL's image processor and tokens (<img>, image_seq_length · tiles
  <IMG_CONTEXT>, </img> per image), the chat template's `<image>` placeholder replaced.
"""

from __future__ import annotations

from typing import Any

from hpcmem.models.internvl import INTERNVL_VISION_DEFAULTS, InternVLTowerSpec, internvl_tower_from_config

# QianfanOCRVisionConfig's class defaults where they differ from InternVLVisionConfig's (configuration_qianfan_ocr.py)
QIANFAN_VISION_DEFAULTS: dict[str, Any] = {**INTERNVL_VISION_DEFAULTS, "attention_bias": True, "drop_path_rate": 0.1}


def qianfan_tower_from_config(cfg: dict[str, Any], name: str) -> InternVLTowerSpec:
    """The InternVLTowerSpec of a qianfan_ocr config.json dict (its vision_config a qianfan_ocr_vision)."""
    return internvl_tower_from_config(cfg, name, model_type="qianfan_ocr", defaults=QIANFAN_VISION_DEFAULTS)

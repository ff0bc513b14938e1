"""Mistral Large 4's (model_type "mistral_large4") vision part: Mistral 3's Pixtral tower and projector
(hpcmem.models.pixtral's `PixtralTowerSpec`) at Mistral Large 4's own defaults.

transformers 5.24 models/mistral_large4/modular_mistral_large4.py:
- `MistralLarge4Config(Mistral3Config)`: the outer keys are Mistral3Config's (image_token_index 10, projector_hidden_act
  gelu, vision_feature_layer -1, multimodal_projector_bias False, spatial_merge_size 2), tie_word_embeddings False.
  `sub_configs_defaults` builds an omitted vision_config as a `pixtral` (AutoConfig) with init_kwargs width 2048, MLP
  6144, 30 layers, 16 heads, 14 px patches, image_size 1540, silu ("same as Mistral Small 3.1: gated SiLU MLP"); a
  vision_config the file names takes PixtralVisionConfig's class defaults for what it omits (hpcmem.models.pixtral
  `pixtral_vision_values`). text_config is always a `MistralLarge4TextConfig` (width 6144 when omitted): an MLA / MoE
  decoder with a sparse-attention indexer, learned (hpcmem.models.vlm_learned).
- `MistralLarge4Model(Mistral3Model)`: Mistral3Model's __init__ (vision_tower `AutoModel.from_config`,
  `Mistral3MultiModalProjector`, the language model) and `get_image_features`; its forward is Mistral3Model's (the
  projector's rows `masked_scatter`ed into the [IMG] embeddings) with the vision outputs kept in `image_outputs`.
- `MistralLarge4ForConditionalGeneration(Mistral3ForConditionalGeneration)`: an untied lm_head and the final logit
  softcapping, which TRL's fused LM head applies per tile (trl/trainer/utils.py `add_fused_lm_head` reads
  text_config.final_logit_softcapping).
- The processor: `PixtralProcessor` around `PixtralImageProcessor(Pil)` (auto/processing_auto.py,
  auto/image_processing_auto.py rows for mistral_large4), as mistral3's.
"""

from __future__ import annotations

from typing import Any

from hpcmem.models.pixtral import PixtralTowerSpec, pixtral_spec

# MistralLarge4Config.sub_configs_defaults' init_kwargs for an omitted vision_config (over PixtralVisionConfig's)
MISTRAL_LARGE4_VISION_DEFAULTS: dict[str, Any] = {"hidden_size": 2048, "intermediate_size": 6144,
                                                  "num_hidden_layers": 30, "num_attention_heads": 16,
                                                  "patch_size": 14, "image_size": 1540, "hidden_act": "silu"}
MISTRAL_LARGE4_TEXT_HIDDEN = 6144       # `MistralLarge4TextConfig.hidden_size`: an omitted text_config's width


def mistral_large4_tower_from_config(cfg: dict[str, Any], name: str) -> PixtralTowerSpec:
    """The PixtralTowerSpec of a mistral_large4 config.json dict; keys it omits take the config classes' defaults."""
    return pixtral_spec(cfg, name, "mistral_large4", MISTRAL_LARGE4_VISION_DEFAULTS, MISTRAL_LARGE4_TEXT_HIDDEN)

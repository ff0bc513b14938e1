"""DeepseekVLTowerSpec: DeepSeek-VL's (model_type "deepseek_vl") vision tower and aligner, as its config.json's
`vision_config` and outer keys describe them, their linear layers and parameter count (transformers 5.24).

- The config (models/deepseek_vl/configuration_deepseek_vl.py `DeepseekVLConfig`): `sub_configs_defaults` builds an
  omitted `vision_config` as a bare `siglip_vision_model` config (SiglipVisionConfig's class defaults, hpcmem.models.
  siglip `SIGLIP_DEFAULTS`) and an omitted `text_config` as a bare `llama` one; `image_token_id` 100015,
  `tie_word_embeddings` True.
- The tower (models/deepseek_vl/modeling_deepseek_vl.py `DeepseekVLModel.vision_model`, `AutoModel.from_config` of
  that config): models/siglip/modeling_siglip.py `SiglipVisionModel`, counted by hpcmem.models.siglip
  `siglip_tower_params`. `get_image_features` reads its `last_hidden_state` (after post_layernorm): every patch is an
  image token, (image_size / patch_size)² per image. With `vision_use_head` (SiglipVisionConfig's default)
  SiglipVisionTransformer.forward also runs the attention-pooling head, whose output get_image_features overwrites.
- The aligner (`DeepseekVLAligner`): linear1 (vision hidden_size → text hidden_size, bias) → nn.GELU → linear2
  (text hidden_size → text hidden_size, bias).
- The processor (processing_deepseek_vl.py `DeepseekVLProcessor`): `replace_image_token` writes `num_image_tokens`
  (576, (384 / 16)²) image tokens per image, no markers; `get_placeholder_mask` raises unless that equals the
  tower's patches. Its image processor (`DeepseekVLImageProcessor`, Janus's) resizes the longest edge to the square
  `size` and pads the rest to a square with the background colour: one resolution whatever the image's size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpcmem.errors import SpecError
from hpcmem.models.paligemma import PaliGemmaTowerSpec
from hpcmem.models.siglip import SIGLIP_DEFAULTS
from hpcmem.models.tower_base import TowerLinear, encoder_layer_linears, text_width

LLAMA_HIDDEN = 4096             # LlamaConfig.hidden_size: the text width of an omitted text_config


@dataclass(frozen=True, kw_only=True)
class DeepseekVLTowerSpec(PaliGemmaTowerSpec):
    """A SigLIP tower read whole (last_hidden_state) under DeepSeek-VL's two-linear aligner; `out_hidden_size` is the
    text width. PaliGemma's tower, checks and geometry; its own projector."""

    family: str = "deepseek_vl"

    @property
    def aligner_hidden_layers(self) -> int:
        """The aligner's Linears after the first, each behind a GELU: DeepseekVLAligner's linear2."""
        return 1

    def linears(self) -> tuple[TowerLinear, ...]:
        h, i, d, o = self.hidden_size, self.intermediate_size, self.depth, self.out_hidden_size
        return (*encoder_layer_linears(h, i, d),
                TowerLinear(name="linear1", in_features=h, out_features=o, count=1, part="merger"),
                TowerLinear(name="linear2", in_features=o, out_features=o, count=1, part="merger"))


def deepseek_vl_tower_from_config(cfg: dict[str, Any], name: str) -> DeepseekVLTowerSpec:
    """The DeepseekVLTowerSpec of a deepseek_vl config.json dict; keys it omits take SiglipVisionConfig's defaults."""
    raw = cfg.get("vision_config")
    if raw is not None and not isinstance(raw, dict):
        raise SpecError(f"model {name}: vision_config must be an object, got {type(raw).__name__}")
    if raw is not None and raw.get("model_type", "siglip_vision_model") != "siglip_vision_model":
        raise SpecError(f"model {name}: deepseek_vl's vision_config.model_type {raw.get('model_type')!r} is not "
                        "modelled; hpcmem models deepseek_vl with a SigLIP tower (siglip_vision_model)")
    vc = {**SIGLIP_DEFAULTS, **(raw or {})}
    for key in ("image_size", "patch_size"):
        if isinstance(vc[key], (list, tuple)):
            raise SpecError(f"model {name}: vision_config.{key} {vc[key]!r}: hpcmem models square images (an integer)")
    return DeepseekVLTowerSpec(model_type="deepseek_vl", depth=vc["num_hidden_layers"], hidden_size=vc["hidden_size"],
                               intermediate_size=vc["intermediate_size"], num_heads=vc["num_attention_heads"],
                               in_channels=vc["num_channels"], image_size=vc["image_size"],
                               patch_size=vc["patch_size"], out_hidden_size=text_width(cfg, LLAMA_HIDDEN),
                               hidden_act=str(vc["hidden_act"]), pooling_head=bool(vc.get("vision_use_head")))

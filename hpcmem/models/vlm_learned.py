"""A vision-language model whose decoder no family descriptor covers (Aya Vision's Cohere2): its text part's terms
from a learned profile of its text config (hpcmem.models.profile, `hpcmem models learn` on that config), its tower
and projector from hpcmem.models.vision as for a derived decoder. The estimate then runs the learned step
(hpcmem.estimate.learned) and adds the tower's phases exactly as for derived types (hpcmem.estimate.vision
`with_vision`): the decoder runs on the same max_length embeddings, the image tokens' rows scattered into them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hpcmem.errors import SpecError
from hpcmem.models.config import ARCHITECTURES, check_model_config, checkpoint_dtype
from hpcmem.models.profile import find_profile, load_profile, spec_from_profile
from hpcmem.models.spec import ModelSpec
from hpcmem.models.vision import VISION_LANGUAGE, text_part, vision_spec_from_config


def learned_text(cfg: dict[str, Any]) -> bool:
    """Whether `cfg` is a vision-language type whose decoder (its text part) is no derived family."""
    return str(cfg.get("model_type")) in VISION_LANGUAGE and str(text_part(cfg).get("model_type")) not in ARCHITECTURES


def vlm_spec_from_learned(cfg: dict[str, Any], name: str) -> ModelSpec:
    """The ModelSpec of a `learned_text` config: the text part's learned profile, the tower's VisionSpec."""
    check_model_config(cfg, name)
    vision = vision_spec_from_config(cfg, name)
    text = text_part(cfg)
    path = find_profile(text)
    whole = find_profile(cfg) if path is None else None
    if whole is not None:
        # a profile learned on the whole config before its type took images (gemma4: Gemma4ForCausalLM's text
        # model, what AutoModelForCausalLM builds of it): its text-only estimate, as before, no tower
        return replace(spec_from_profile(load_profile(whole), name), dtype=checkpoint_dtype(cfg))
    if path is None:
        raise SpecError(f"model {name}: {cfg['model_type']}'s decoder ({text['model_type']}) has no family "
                        "descriptor and no learned profile of its text config; learn one with `hpcmem models learn` "
                        "on the text config (text_config with tie_word_embeddings as the outer config sets it)")
    spec = spec_from_profile(load_profile(path), name)
    return replace(spec, model_type=str(cfg["model_type"]), vision=vision, dtype=checkpoint_dtype(cfg))

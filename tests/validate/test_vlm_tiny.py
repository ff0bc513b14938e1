"""The tiny image-text models' shrink (hpcmem.validate.vlm_tiny) where a width is not named by a width key: MoE widths
a config class leaves None while its layers build experts (DiffusionGemma), and a tower whose layer widths are planned
from its patch (Inkling); and a config that reads its image token from a copy of the tokenizer's vocabulary its
defaults leave None (Emu3's, Chameleon's `vocabulary_map`) is given one. Each tiny model is built on the meta device
from the real classes."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from hpcmem.validate.vlm_tiny import tiny_config  # noqa: E402
from hpcmem.validate.vlm_trainable import MAX_PARAMS  # noqa: E402

pytestmark = pytest.mark.torch


def _meta(config: dict):
    import torch

    from hpcmem.validate.trl_run import build_model

    with torch.device("meta"):
        return build_model(config, image_text=True)


def test_moe_widths_the_defaults_leave_none_are_filled_when_the_layers_build_experts():
    """DiffusionGemmaTextConfig's defaults leave num_experts, top_k_experts and moe_intermediate_size None, and every
    DiffusionGemma layer builds a router (nn.Linear(hidden_size, num_experts)) and experts: the class defaults do not
    build, the tiny model does, with 4 experts, 2 per token, 32 wide."""
    from transformers import DiffusionGemmaTextConfig

    defaults = DiffusionGemmaTextConfig()
    assert (defaults.num_experts, defaults.top_k_experts, defaults.moe_intermediate_size) == (None, None, None)
    text = tiny_config("diffusion_gemma")["text_config"]
    assert (text["num_experts"], text["top_k_experts"], text["moe_intermediate_size"]) == (4, 2, 32)
    model = _meta(tiny_config("diffusion_gemma"))
    layer = model.model.encoder.language_model.layers[0]
    assert layer.router.proj.weight.shape == (4, 64)                 # (num_experts, hidden_size)
    assert layer.experts.down_proj.shape == (4, 64, 32)              # (experts, hidden, expert FFN)
    assert sum(p.numel() for p in model.parameters()) < MAX_PARAMS


def test_a_moe_switch_keeps_the_unset_widths_none():
    """Gemma 4's enable_moe_block (False in its defaults) says None is "no experts": the widths stay None."""
    text = tiny_config("gemma4")["text_config"]
    assert text["enable_moe_block"] is False
    assert (text["num_experts"], text["top_k_experts"], text["moe_intermediate_size"]) == (None, None, None)


def test_a_tower_planned_from_its_patch_gets_a_small_patch():
    """InklingVisionModel's last stage is patch² · 3 channels · temporal patch · 64 wide (plan_out_scales): 40² · 3 · 2
    · 64 = 614,400 at the defaults' 40 × 40 × 2 patch, 2² · 3 · 2 · 64 = 1,536 at the tiny one's 2 × 2 × 2."""
    from transformers.models.inkling.modeling_inkling import plan_out_scales

    assert int(plan_out_scales(2, 40, 24, 3)[-1, 3]) == 40 * 40 * 3 * 2 * 64
    config = tiny_config("inkling_mm_model")
    assert config["vision_config"]["patch_size"] == 2 and config["vision_config"]["temporal_patch_size"] == 2
    model = _meta(config)
    widest = max(max(layer.projection.weight.shape) for layer in model.model.vision_tower.encoder_layers[:-1])
    assert widest == 2 * 2 * 3 * 2 * 64
    assert sum(p.numel() for p in model.parameters()) < MAX_PARAMS


@pytest.mark.parametrize("model_type", ["emu3", "chameleon"])
def test_a_vocabulary_map_the_defaults_leave_none_is_given(model_type: str) -> None:
    import torch
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from hpcmem.validate.trl_run import build_model

    assert CONFIG_MAPPING[model_type]().vocabulary_map is None
    config = tiny_config(model_type)
    vocab = (config.get("text_config") or config)["vocab_size"]
    assert config["vocabulary_map"] == {"<image>": vocab - 1}   # the shrunk vocabulary (512 ids) holds it
    with torch.device("meta"):
        model = build_model(config, image_text=True)
    assert model.config.image_token_id == vocab - 1


def test_a_config_without_a_vocabulary_map_is_left_alone() -> None:
    assert "vocabulary_map" not in tiny_config("llava")

"""GLM-4.1V's tower and merger (hpcmem.models.glm4v) against transformers' Glm4vVisionModel built on the meta device:
the tower's and the merger's parameter counts, every linear's shape and bias, for the config class defaults and a
cut with qkv bias; glm46v and glmga build the same tower class from their vision_config."""

from __future__ import annotations

import pytest

from hpcmem.models.glm4v import glm4v_tower_from_config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.torch


def _meta_tower(vision: dict):
    from transformers.models.glm4v.modeling_glm4v import Glm4vVisionModel

    with torch.device("meta"):
        return Glm4vVisionModel(transformers.Glm4vVisionConfig(**vision))


def _numel(module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("vision", [
    {},
    {"depth": 2, "attention_bias": True, "image_size": 448, "hidden_size": 256, "num_heads": 4,
     "out_hidden_size": 512, "intermediate_size": 768, "spatial_merge_size": 2, "temporal_patch_size": 2},
])
def test_tower_and_merger_equal_the_meta_model(vision):
    tower = _meta_tower(vision)
    spec = glm4v_tower_from_config({"model_type": "glm4v", "vision_config": vision}, "glm4v")
    assert spec.merger_params == _numel(tower.merger)
    assert spec.tower_params == _numel(tower) - _numel(tower.merger)
    block = tower.blocks[0]
    for x in spec.linears():
        module = block.get_submodule(x.name) if x.part == "tower" else tower.merger.get_submodule(x.name)
        assert (module.in_features, module.out_features, module.bias is not None) == \
            (x.in_features, x.out_features, x.bias), x.name


@pytest.mark.parametrize("model_type", ["glm4v", "glm46v", "glmga"])
def test_the_three_types_build_the_same_tower_class(model_type):
    """Glm46VModel / glmga build `visual` with AutoModel.from_config of a glm4v_vision sub-config."""
    config = transformers.AutoConfig.for_model(model_type)
    assert config.vision_config.model_type == "glm4v_vision"
    assert config.text_config.model_type == "glm4v_text"
    with torch.device("meta"):
        tower = transformers.AutoModel.from_config(config.vision_config)
    assert type(tower).__name__ == "Glm4vVisionModel"
    spec = glm4v_tower_from_config({"model_type": model_type}, model_type)
    assert spec.num_params == _numel(tower)

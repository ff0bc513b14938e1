"""ViP-LLaVA's parts as hpcmem counts them (hpcmem.models.vipllava's VipLlavaTowerSpec, the language model by the llama
family) against `AutoModelForImageTextToText.from_config` on the meta device: the Vicuna-7B width cut to 1 decoder
layer and 12 CLIP layers (VipLlavaConfig's default feature layers need at least 11), VipLlavaConfig's own defaults, the
catalog's llava-hf/vip-llava-7b-hf, and one feature layer given as an integer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.models.resolve import catalog, resolve_model
from hpcmem.models.vipllava import vipllava_tower_from_config
from tests.helpers.meta_models import meta_image_text_model, meta_part_counts

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vlm"
CUT = FIXTURES / "vip-llava-7b-width-L1-D12.json"
HUB = "llava-hf/vip-llava-7b-hf"


def _configs() -> list[dict]:
    cut = json.loads(CUT.read_text())
    return [cut, {"model_type": "vipllava"}, catalog()[HUB]["config"], {**cut, "vision_feature_layer": -3}]


@pytest.mark.torch
@pytest.mark.parametrize("cfg", _configs(), ids=["width-L1-D12", "class-defaults", "7b", "one-layer"])
def test_parts_equal_the_meta_model(cfg, tmp_path):
    pytest.importorskip("transformers")
    model = meta_image_text_model(cfg)
    assert type(model).__name__ == "VipLlavaForConditionalGeneration"
    count = meta_part_counts(model)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    spec = resolve_model(str(path))
    v = spec.vision
    assert count == {"tower": v.tower_params, "merger": v.merger_params, "language": spec.num_params}
    # the projector's LayerNorm and linear_1 span the feature layers' concatenated width
    layers = model.config.vision_feature_layer
    k = 1 if isinstance(layers, int) else len(layers)
    assert model.model.multi_modal_projector.projector_layernorm.weight.shape[0] == k * v.hidden_size == v.concat_width


def test_the_deepest_feature_layer_sets_the_trained_layers():
    spec = vipllava_tower_from_config(json.loads(CUT.read_text()), "m")
    # hidden_states[k] is layer k's output: -2 of 12 layers is layer 11; -5, -8, -11 and 6 lie below it
    assert (spec.depth, spec.feature_layers, spec.trained_layers) == (12, (-2, -5, -8, -11, 6), 11)
    assert spec.tokens_per_image == (336 // 14) ** 2 == 576
    assert vipllava_tower_from_config({"model_type": "vipllava", "vision_feature_layer": [3, -20]}, "m") \
        .trained_layers == 5        # 24 layers: -20 → hidden_states[5]


def test_a_feature_layer_past_the_tower_is_refused():
    with pytest.raises(SpecError, match="vision_feature_layer -13 must pick a layer's output"):
        vipllava_tower_from_config({**json.loads(CUT.read_text()), "vision_feature_layer": [-2, -13]}, "m")

"""GLM-4.1V's tower and merger (hpcmem.models.glm4v) against transformers' Glm4vVisionModel built on the meta device:
the tower's and the merger's parameter counts, every linear's shape and bias, for the config class defaults and a
cut with qkv bias; glm46v and glmga build the same tower class from their vision_config."""

from __future__ import annotations

from pathlib import Path

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


CUT = Path(__file__).resolve().parents[1] / "fixtures" / "vlm" / "glm4v-9b-width-L2-D2.json"
# (height, width) around the resize's edges: under the factor, rounding, the lower and upper pixel bounds
SIZES = [(448, 448), (480, 640), (20, 700), (27, 28), (56, 56), (1000, 37), (3000, 4000), (7000, 9000), (333, 517)]


def test_parts_and_linears_equal_the_meta_model():
    """The cut of estimator/cases/vlm-glm4v.yaml: tower (visual, less its merger), merger and language model, and
    every nn.Linear of the blocks and the merger, as AutoModelForImageTextToText builds them on the meta device;
    q/k/v bias and o_proj's none (Glm4vTextAttention), the head untied (Glm4vConfig.tie_word_embeddings)."""
    from tests.helpers.meta_models import assert_tower_and_projector_match

    model, spec = assert_tower_and_projector_match(CUT, "Glm4vForConditionalGeneration", tower="visual",
                                                   layers="blocks", projector="visual.merger")
    attn = model.model.language_model.layers[0].self_attn
    assert (spec.qkv_bias, spec.o_bias) == (attn.q_proj.bias is not None, attn.o_proj.bias is not None)
    assert spec.tie_word_embeddings is (model.get_output_embeddings().weight is model.get_input_embeddings().weight)
    assert spec.head_dim == attn.head_dim and spec.rope_cat


@pytest.mark.parametrize("height,width", SIZES)
def test_the_resize_is_transformers_smart_resize(height, width):
    # the PIL image processor's copy (the torchvision one needs torchvision): "Copied from ... image_processing_glm4v"
    from transformers.models.glm4v.image_processing_pil_glm4v import smart_resize

    from hpcmem.models.glm4v import GLM4V_MAX_PIXELS, GLM4V_MIN_PIXELS, glm4v_resize

    assert glm4v_resize(height, width, 28, 2, GLM4V_MIN_PIXELS, GLM4V_MAX_PIXELS) == smart_resize(
        2, height, width, temporal_factor=2, factor=28, min_pixels=GLM4V_MIN_PIXELS, max_pixels=GLM4V_MAX_PIXELS)


@pytest.mark.parametrize("height,width", [(448, 448), (480, 640), (56, 56), (1000, 37)])
def test_image_tokens_and_patches_are_the_processors(height, width):
    """Glm4vProcessor (hpcmem.trace.vision_glm4v: the PIL image processor, the class's size bounds) on one blank image:
    its image_grid_thw, pixel rows and <|image|> tokens equal hpcmem.job.images' geometry."""
    from PIL import Image

    from hpcmem.job.images import image_geometry
    from hpcmem.trace.vision_glm4v import IMAGE
    from hpcmem.validate.cases import case_job

    job = case_job({"trainer": "sft", "model_name_or_path": str(CUT), "max_length": 8192, "images_per_example": 1,
                    "image_height": height, "image_width": width, "dtype": "bfloat16", "bf16": True})
    from hpcmem.trace.vision_glm4v import processor

    proc = processor(job)
    out = proc(text=[IMAGE], images=[Image.new("RGB", (width, height))], return_tensors="pt")
    g = image_geometry(job.train, job.model.vision)
    assert tuple(out["image_grid_thw"][0].tolist()) == g.grid_thw
    assert out["pixel_values"].shape[0] == g.patches
    assert int((out["input_ids"][0] == proc.image_token_id).sum()) == g.tokens

"""GLM-4.6V (glm46v) and glmga, which build GLM-4.1V's classes (hpcmem.models.glm4v) from glm4v_vision / glm4v_text
sub-configs: the cuts of estimator/cases/vlm-glm46v.yaml and vlm-glmga.yaml against the meta model
AutoModelForImageTextToText builds (Glm46VForConditionalGeneration for both), their processors' image tokens
(Glm46VProcessor around Glm46VImageProcessorPil / GlmgaImageProcessorPil), and the sub-config types refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.models.glm4v import glm4v_tower_from_config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.torch

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vlm"
CUTS = {"glm46v": FIXTURES / "glm46v-defaults-L2-D2.json", "glmga": FIXTURES / "glmga-defaults-L2-D2.json"}


@pytest.mark.parametrize("model_type", sorted(CUTS))
def test_parts_and_linears_equal_the_meta_model(model_type):
    """Tower (visual, less its merger), merger, language model and every nn.Linear of the blocks and the merger, as
    the meta model builds them; q/k/v bias and o_proj's none (Glm4vTextAttention); the head untied: Glm46VConfig has
    no __post_init__ forwarding text_config's flag, and tie_word_embeddings defaults to False."""
    from tests.helpers.meta_models import assert_tower_and_projector_match

    model, spec = assert_tower_and_projector_match(CUTS[model_type], "Glm46VForConditionalGeneration",
                                                   tower="visual", layers="blocks", projector="visual.merger")
    assert type(model.model.visual).__name__ == "Glm4vVisionModel"
    assert type(model.model.language_model).__name__ == "Glm4vTextModel"
    attn = model.model.language_model.layers[0].self_attn
    assert (spec.qkv_bias, spec.o_bias) == (attn.q_proj.bias is not None, attn.o_proj.bias is not None)
    assert spec.tie_word_embeddings is (model.get_output_embeddings().weight is model.get_input_embeddings().weight)
    assert spec.model_type == model_type and spec.vision.model_type == model_type


@pytest.mark.parametrize("model_type", sorted(CUTS))
def test_a_true_text_tie_flag_is_not_forwarded(model_type):
    """Unlike Glm4vConfig, Glm46VConfig keeps its own tie_word_embeddings: a true text_config flag leaves the head
    untied in the meta model and in hpcmem's spec."""
    from hpcmem.models.resolve import spec_from_config
    from tests.helpers.meta_models import meta_image_text_model

    cfg = json.loads(CUTS[model_type].read_text())
    cfg["text_config"] = {**cfg["text_config"], "tie_word_embeddings": True}
    model = meta_image_text_model(cfg)
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    spec = spec_from_config(cfg, model_type)
    assert tied is False and spec.tie_word_embeddings is False


@pytest.mark.parametrize("key,sub", [("text_config", "qwen2"), ("vision_config", "qwen2_5_vl")])
def test_other_sub_config_types_are_refused(key, sub):
    """Glm46VModel builds whatever its sub-configs name (AutoModel.from_config); hpcmem takes glm4v_vision and
    glm4v_text (or glm4v_moe_text, GLM-4.5V's MoE decoder: tests/estimate/test_estimate_vlm_glm4v_moe.py) and refuses
    another rather than count a decoder it does not build."""
    cfg = {**json.loads(CUTS["glm46v"].read_text())}
    cfg[key] = {**cfg[key], "model_type": sub}
    with pytest.raises(SpecError, match=sub):
        glm4v_tower_from_config(cfg, "glm46v")


@pytest.mark.parametrize("model_type,height,width", [("glm46v", 512, 512), ("glm46v", 600, 800),
                                                     ("glm46v", 1000, 37), ("glmga", 672, 896), ("glmga", 56, 56),
                                                     ("glmga", 333, 517)])
def test_image_tokens_and_patches_are_the_processors(model_type, height, width):
    """The type's processor (hpcmem.trace.vision_glm4v PROCESSORS) on one blank image: its class, image_grid_thw,
    pixel rows and <|image|> tokens equal hpcmem.job.images' geometry."""
    from hpcmem.trace.vision_glm4v import is_processor
    from tests.helpers.vlm_cuts import assert_processor_geometry

    proc = assert_processor_geometry(CUTS[model_type], height, width, "Glm46VProcessor")
    assert is_processor(proc)
    assert type(proc.image_processor).__name__ == ("GlmgaImageProcessorPil" if model_type == "glmga"
                                                   else "Glm46VImageProcessorPil")

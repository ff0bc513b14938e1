"""GLM-OCR's tower and merger (hpcmem.models.glm4v `GlmOcrTowerSpec`) against transformers' GlmOcrVisionModel built on
the meta device: parameter counts and every linear's shape and bias for the config class defaults and a cut without
biases; the cut of estimator/cases/vlm-glm-ocr.yaml as AutoModelForImageTextToText builds it (tower, merger, text
model, q/k/v without bias, head_dim from the config); the processor's image tokens and patches."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.models.resolve import resolve_model
from hpcmem.models.glm4v import GlmOcrTowerSpec, glm4v_tower_from_config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.torch

CUT = Path(__file__).resolve().parents[1] / "fixtures" / "vlm" / "glm-ocr-L2-D4.json"


def _numel(module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("vision", [
    {},
    {"depth": 2, "attention_bias": False, "hidden_size": 256, "num_heads": 4, "out_hidden_size": 384,
     "intermediate_size": 640, "in_channels": 3},
])
def test_tower_and_merger_equal_the_meta_model(vision):
    from transformers.models.glm_ocr.modeling_glm_ocr import GlmOcrVisionModel

    with torch.device("meta"):
        tower = GlmOcrVisionModel(transformers.GlmOcrVisionConfig(**vision))
    spec = glm4v_tower_from_config({"model_type": "glm_ocr", "vision_config": vision}, "glm_ocr")
    assert isinstance(spec, GlmOcrTowerSpec) and spec.qk_norm
    assert spec.merger_params == _numel(tower.merger)
    assert spec.tower_params == _numel(tower) - _numel(tower.merger)
    assert spec.block_params == _numel(tower.blocks[0])
    block = tower.blocks[0]
    for x in spec.linears():
        module = block.get_submodule(x.name) if x.part == "tower" else tower.merger.get_submodule(x.name)
        assert (module.in_features, module.out_features, module.bias is not None) == \
            (x.in_features, x.out_features, x.bias), x.name


def test_the_cut_equals_the_meta_model(tmp_path):
    """Tower (visual, less its merger), merger and language model as built; GlmOcrTextAttention's q/k/v without bias
    (glm4v's text attention has them); head_dim 128 from the config (not hidden // heads = 96)."""
    from tests.helpers.meta_models import assert_tower_and_projector_match

    model, spec = assert_tower_and_projector_match(CUT, "GlmOcrForConditionalGeneration", tower="visual",
                                                   layers="blocks", projector="visual.merger")
    attn = model.model.language_model.layers[0].self_attn
    assert (spec.qkv_bias, spec.o_bias) == (False, False) == (attn.q_proj.bias is not None,
                                                               attn.o_proj.bias is not None)
    assert spec.head_dim == attn.head_dim == 128
    # a text_config that says attention_bias true changes nothing: the class never reads it
    biased = tmp_path / "biased.json"
    cfg = json.loads(CUT.read_text())
    cfg["text_config"]["attention_bias"] = True
    biased.write_text(json.dumps(cfg))
    assert not resolve_model(str(biased)).qkv_bias
    assert spec.tie_word_embeddings is (model.get_output_embeddings().weight is model.get_input_embeddings().weight)


@pytest.mark.parametrize("height,width", [(512, 512), (768, 1024), (56, 56), (1000, 37)])
def test_image_tokens_and_patches_are_the_processors(height, width):
    """Glm46VProcessor around Glm46VImageProcessorPil (hpcmem.trace.vision_glm4v) on one blank image: its
    image_grid_thw, pixel rows and <|image|> tokens equal hpcmem.job.images' geometry."""
    from tests.helpers.vlm_cuts import assert_processor_geometry

    assert_processor_geometry(CUT, height, width, "Glm46VProcessor")


def test_the_class_defaults_widths_that_cannot_meet_are_refused(tmp_path, capsys):
    """GlmOcrConfig's defaults: a 1,536-wide merger over a 1,024-wide text model. transformers cannot place the image
    features into the embeddings (TRL 1.16 reports it as a too-short max_length: traced), so the estimate refuses it
    in one line naming both widths."""
    from tests.helpers.cli_main import run_main

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "glm_ocr", "text_config": {"num_hidden_layers": 2},
                                                      "vision_config": {"depth": 2}}))
    code, out, err = run_main(["estimate", "sft", "--model_name_or_path", str(tmp_path / "config.json"),
                               "--images_per_example", "1", "--image_height", "512", "--image_width", "512"], capsys)
    assert code == 2 and not out and err.count("\n") == 1
    assert "vision_config.out_hidden_size 1536 is not the language model's hidden_size 1024" in err

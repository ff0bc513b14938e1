"""PaddleOCR-VL's tower and projector (hpcmem.models.paddleocr_vl `PaddleOcrTowerSpec`) against transformers'
PaddleOCRVisionModel and PaddleOCRProjector built on the meta device: parameter counts and every linear's shape and
bias for the config class defaults and a smaller tower; the cut of estimator/cases/vlm-paddleocr-vl.yaml as
AutoModelForImageTextToText builds it (tower, projector, language model); the processor's image tokens and patches."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcmem.models.paddleocr_vl import PaddleOcrTowerSpec, paddleocr_tower_from_config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.torch

CUT = Path(__file__).resolve().parents[1] / "fixtures" / "vlm" / "paddleocr-vl-L2-D2.json"


def _numel(module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("vision", [
    {},
    {"num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4, "intermediate_size": 640,
     "image_size": 224, "patch_size": 16, "spatial_merge_size": 2},
])
def test_tower_and_projector_equal_the_meta_model(vision):
    from transformers.models.paddleocr_vl.modeling_paddleocr_vl import PaddleOCRProjector, PaddleOCRVisionModel

    config = transformers.PaddleOCRVLConfig(vision_config=vision, text_config={"num_hidden_layers": 1})
    with torch.device("meta"):
        tower = PaddleOCRVisionModel(config.vision_config)
        projector = PaddleOCRProjector(config)
    spec = paddleocr_tower_from_config({"model_type": "paddleocr_vl", "vision_config": vision}, "paddleocr_vl")
    assert isinstance(spec, PaddleOcrTowerSpec)
    assert spec.tower_params == _numel(tower)
    assert spec.merger_params == _numel(projector)
    layer = tower.vision_model.encoder.layers[0]
    assert spec.block_params == _numel(layer)
    for x in spec.linears():
        module = layer.get_submodule(x.name) if x.part == "tower" else projector.get_submodule(x.name)
        assert (module.in_features, module.out_features, module.bias is not None) == \
            (x.in_features, x.out_features, x.bias), x.name


def test_the_cut_equals_the_meta_model():
    """Tower (visual), projector and language model as built, and the head tied as PaddleOCRVLConfig says."""
    from tests.helpers.meta_models import assert_tower_and_projector_match

    model, spec = assert_tower_and_projector_match(CUT, "PaddleOCRVLForConditionalGeneration", tower="visual",
                                                   layers="vision_model.encoder.layers", projector="projector")
    assert spec.tie_word_embeddings is (model.get_output_embeddings().weight is model.get_input_embeddings().weight)


@pytest.mark.parametrize("height,width", [(512, 512), (768, 1024), (56, 56), (3000, 2000)])
def test_image_tokens_and_patches_are_the_processors(height, width):
    """PaddleOCRVLProcessor around PaddleOCRVLImageProcessorPil (hpcmem.trace.vision_paddleocr_vl) on one blank image,
    its class pixel bounds (384² … 1536²): image_grid_thw, pixel rows and image tokens equal hpcmem.job.images'
    geometry — a 56 px image is resized up to the lower bound, a 3000×2000 one down to the upper."""
    from tests.helpers.vlm_cuts import assert_processor_geometry

    assert_processor_geometry(CUT, height, width, "PaddleOCRVLProcessor")


@pytest.mark.parametrize("tie", [None, False, True])
def test_a_flat_config_is_read_as_transformers_reads_it(tie):
    """PaddleOCR-VL's Hub configs are flat (the text fields at the top, PaddleOCRVLConfig.__post_init__ builds
    text_config from them over PaddleOCRTextConfig's defaults): hpcmem's text part takes the same widths, and the head
    is tied as the real class ties it — whatever the top-level flag says, the outer config forwards the text config's
    true default."""
    from hpcmem.models.vision import text_part

    cfg = {"model_type": "paddleocr_vl", "hidden_size": 256, "num_hidden_layers": 3, "intermediate_size": 512,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000,
           "vision_config": {"num_hidden_layers": 1, "hidden_size": 128, "intermediate_size": 256,
                             "num_attention_heads": 2}}
    if tie is not None:
        cfg["tie_word_embeddings"] = tie
    config = transformers.AutoConfig.for_model(**cfg)
    with torch.device("meta"):
        model = transformers.AutoModelForImageTextToText.from_config(config)
    text = text_part(cfg)
    keys = ("hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads", "num_key_value_heads",
            "vocab_size", "head_dim", "max_position_embeddings")
    assert {k: text[k] for k in keys} == {k: getattr(config.text_config, k) for k in keys}
    assert text["tie_word_embeddings"] is (model.get_output_embeddings().weight is model.get_input_embeddings().weight)

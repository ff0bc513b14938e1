"""GLM-4.5V (glm4v_moe) as hpcmem builds it: its tower is glm4v's (Glm4vMoeVisionModel a `pass` subclass), so the
tower and merger equal the meta model's; its decoder is taken as glm4_moe's layers — Glm4vMoeTextModel and the model
Glm4MoeForCausalLM builds from the same text config hold the same parameters, layer by layer, module by module (the
M-RoPE tables are buffers); the head is untied."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.torch

CUT = Path(__file__).resolve().parents[1] / "fixtures" / "vlm" / "glm4v-moe-L2-D2.json"


def test_the_tower_is_glm4vs_and_the_spec_counts_it():
    from hpcmem.models.resolve import resolve_model
    from tests.helpers.meta_models import meta_image_text_model, meta_part_counts

    model = meta_image_text_model(json.loads(CUT.read_text()))
    spec = resolve_model(str(CUT))
    assert type(model).__name__ == "Glm4vMoeForConditionalGeneration"
    assert meta_part_counts(model, tower=".visual.", merger=".visual.merger.") == {
        "tower": spec.vision.tower_params, "merger": spec.vision.merger_params, "language": spec.num_params}
    assert spec.learned is not None and spec.learned.config["model_type"] == "glm4_moe"
    assert not spec.tie_word_embeddings
    assert model.get_output_embeddings().weight is not model.get_input_embeddings().weight


def test_the_text_model_has_glm4_moes_parameters():
    """What hpcmem learns on (Glm4MoeForCausalLM's model from the text part) against what the VLM builds."""
    from hpcmem.models.vision import text_part
    from hpcmem.trace.layer_map import build_meta
    from tests.helpers.meta_models import meta_image_text_model

    vlm = meta_image_text_model(json.loads(CUT.read_text())).model.language_model
    text = build_meta(text_part(json.loads(CUT.read_text()))).model
    assert type(text).__name__ == "Glm4MoeModel"
    ours = {n: tuple(p.shape) for n, p in vlm.named_parameters()}
    theirs = {n: tuple(p.shape) for n, p in text.named_parameters()}
    assert ours == theirs and len(ours) > 20

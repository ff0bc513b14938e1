"""Cohere Compass (cohere_compass) as hpcmem builds it against transformers' CohereCompassForConditionalGeneration on
the meta device: the tower is Qwen3-VL's (modular_cohere_compass.py: CohereCompassVisionModel only renames the config class), so its blocks,
merger and deepstack merger equal the meta model's; the decoder's parameters come from the learned profile of the
text config; the head is untied (CohereCompassConfig.tie_word_embeddings False, the text config's True not
forwarded); the processor's image tokens and patches are hpcmem.job.images' geometry."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytestmark = pytest.mark.torch

CUT = Path(__file__).resolve().parents[1] / "fixtures" / "vlm" / "cohere-compass-L2-D2.json"


def test_the_cut_equals_the_meta_model():
    """Tower (visual less its merger, with the deepstack merger), merger and language model as built, and every
    nn.Linear of the tower, its merger and its deepstack merger."""
    import json

    from hpcmem.models.resolve import resolve_model
    from tests.helpers.meta_models import meta_image_text_model, meta_part_counts

    model = meta_image_text_model(json.loads(CUT.read_text()))
    spec = resolve_model(str(CUT))
    assert type(model).__name__ == "CohereCompassForConditionalGeneration"
    v = spec.vision
    assert meta_part_counts(model, tower=".visual.", merger=".visual.merger.") == {
        "tower": v.tower_params + v.deepstack_params, "merger": v.merger_params, "language": spec.num_params}
    linears = {n.split("visual.", 1)[1] for n, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and ".visual." in n}
    mine = {f"blocks.{i}.{x.name}" for x in v.linears() if x.part == "tower" for i in range(x.count)}
    mine |= {f"merger.{x.name}" for x in v.linears() if x.part == "merger"}
    mine |= {f"deepstack_merger_list.{k}.{x.name}" for x in v.linears() if x.part == "deepstack"
             for k in range(len(v.deepstack_visual_indexes))}
    assert linears == mine
    assert len(v.deepstack_visual_indexes) == 1
    assert spec.learned is not None and not spec.tie_word_embeddings
    assert model.get_output_embeddings().weight is not model.get_input_embeddings().weight


@pytest.mark.parametrize("height,width", [(512, 512), (768, 1024), (56, 56), (1000, 37)])
def test_image_tokens_and_patches_are_the_processors(height, width):
    """CohereCompassProcessor around CohereCompassImageProcessorPil (hpcmem.trace.vision_cohere_compass) on one blank
    image: image_grid_thw, pixel rows and <|IMAGE_PAD|> tokens equal hpcmem.job.images' geometry."""
    from tests.helpers.vlm_cuts import assert_processor_geometry

    assert_processor_geometry(CUT, height, width, "CohereCompassProcessor")

"""Mistral 3's parts as hpcmem counts them (hpcmem.models.pixtral, the language model by the mistral family) against
`AutoModelForImageTextToText.from_config` on the meta device: Mistral-Small-3.1-24B's widths cut to 1 decoder layer
and 2 Pixtral layers, Mistral3Config's own defaults (24 Pixtral layers, its default Mistral decoder) and the catalog's
mistralai/Mistral-Small-3.1-24B-Instruct-2503 (whose cut the fixture is, but for the layer counts); the resize and
image tokens against transformers' own PixtralProcessor arithmetic and a hand count; what is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.job.images import image_geometry
from hpcmem.models.resolve import catalog, resolve_model
from tests.helpers.meta_models import meta_image_text_model, meta_part_counts

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vlm"
CUT = FIXTURES / "mistral-small-3.1-width-L1-D2.json"
HUB = "mistralai/Mistral-Small-3.1-24B-Instruct-2503"


@pytest.mark.torch
@pytest.mark.parametrize("cfg", [json.loads(CUT.read_text()), {"model_type": "mistral3"}, catalog()[HUB]["config"]],
                         ids=["width-L1-D2", "class-defaults", "small-3.1-24b"])
def test_parts_equal_the_meta_model(cfg, tmp_path):
    pytest.importorskip("transformers")
    model = meta_image_text_model(cfg)
    assert type(model).__name__ == "Mistral3ForConditionalGeneration"
    count = meta_part_counts(model)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    spec = resolve_model(str(path))
    v = spec.vision
    assert count == {"tower": v.tower_params, "merger": v.merger_params, "language": spec.num_params}
    # by hand: patch_conv without bias and ln_pre; per layer 4 h² attention, 3 h·i MLP, 2 RMSNorms; the projector's
    # RMSNorm, merging_layer 4h → h, linear_1 h → o, linear_2 o → o, none with bias
    h, i, o = (model.config.vision_config.hidden_size, model.config.vision_config.intermediate_size,
               model.config.text_config.hidden_size)
    d = model.config.vision_config.num_hidden_layers
    assert v.tower_params == 3 * 14 * 14 * h + h + d * (4 * h * h + 3 * h * i + 2 * h)
    assert v.merger_params == h + 4 * h * h + h * o + o * o


def test_the_catalog_entry_is_the_fixture_at_full_depth():
    """The cut fixture is the catalog entry with 1 decoder layer and 2 Pixtral layers; the whole model is 24.0 B
    parameters on the meta device (an untied 131,072 × 5,120 head)."""
    full, cut = catalog()[HUB]["config"], json.loads(CUT.read_text())
    strip = lambda c: {**c, "torch_dtype": None, "text_config": {**c["text_config"], "num_hidden_layers": None,  # noqa: E731
                                                                "tie_word_embeddings": None},
                       "vision_config": {**c["vision_config"], "num_hidden_layers": None}}
    assert strip(full) == strip(cut)
    spec = resolve_model(HUB)
    assert spec.num_params + spec.vision.num_params == 24_011_361_280


@pytest.mark.parametrize(("hw", "grid", "tokens"), [
    # 1540×1540 fits: 1540 / 28 = 55 merged rows and cols, 110 × 110 patches; 55 · (55 + 1) tokens
    ((1540, 1540), (110, 110), 55 * 56),
    # 3000×2000: ratio 3000 / 1540, floor → 1540 × 1026; 1026 rounded up to 28 · 37 = 1036; 55 × 37 merged
    ((3000, 2000), (110, 74), 55 * 38),
    # 500×700 fits: 500 → 28 · 18 = 504, 700 = 28 · 25; 18 rows of 25 tokens and a break each
    ((500, 700), (36, 50), 18 * 26),
])
def test_resize_and_tokens_by_hand_and_by_transformers(hw, grid, tokens):
    import numpy as np
    from transformers.models.pixtral.image_processing_pil_pixtral import get_resize_output_image_size

    v = resolve_model(str(CUT)).vision
    h, w = hw
    assert v.grid(h, w) == grid and v.image_tokens(h, w) == tokens
    rh, rw = get_resize_output_image_size(np.zeros((3, h, w)), size=(1540, 1540), patch_size=(28, 28),
                                          input_data_format="channels_first")
    assert (rh // 14, rw // 14) == grid
    assert (rh // 28) * (rw // 28 + 1) == tokens

    class Train:
        image_height, image_width, images_per_example = h, w, 1
    g = image_geometry(Train, v)
    assert (g.grid_thw, g.patches, g.tokens) == ((1, *grid), grid[0] * grid[1], tokens)


def test_other_feature_layers_and_towers_are_refused(tmp_path):
    for change, match in (({"vision_feature_layer": -2}, "vision_feature_layer -2"),
                          ({"vision_config": {"model_type": "siglip_vision_model"}}, "Pixtral tower")):
        path = tmp_path / "config.json"
        path.write_text(json.dumps({**json.loads(CUT.read_text()), **change}))
        with pytest.raises(SpecError, match=match):
            resolve_model(str(path))

"""LightOnOCR's parts as hpcmem counts them (hpcmem.models.lighton_ocr, the language model by the qwen3 family) against
`AutoModelForImageTextToText.from_config` on the meta device: LightOnOCR-1B's widths cut to 1 decoder layer and 2
Pixtral layers, LightOnOcrConfig's own defaults and the catalog's lightonai/LightOnOCR-1B-1025; the resize and image
tokens against transformers' own LightOnOcrProcessor arithmetic and a hand count; the tied head."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.job.images import image_geometry
from hpcmem.models.resolve import catalog, resolve_model
from tests.helpers.meta_models import meta_image_text_model, meta_part_counts

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vlm"
CUT = FIXTURES / "lighton-ocr-1b-width-L1-D2.json"
HUB = "lightonai/LightOnOCR-1B-1025"


@pytest.mark.torch
@pytest.mark.parametrize("cfg", [json.loads(CUT.read_text()), {"model_type": "lighton_ocr"},
                                 json.loads(json.dumps(catalog()[HUB]["config"]))],
                         ids=["width-L1-D2", "class-defaults", "lightonocr-1b"])
def test_parts_equal_the_meta_model(cfg, tmp_path):
    pytest.importorskip("transformers")
    model = meta_image_text_model(cfg)
    assert type(model).__name__ == "LightOnOcrForConditionalGeneration"
    count = meta_part_counts(model, tower=".vision_encoder.", merger=".vision_projection.")
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
    # LightOnOcrConfig.tie_word_embeddings True: lm_head is the token embedding (one tensor)
    assert model.lm_head.weight is model.get_input_embeddings().weight
    assert spec.tie_word_embeddings


def test_the_catalog_entry_is_the_fixture_at_full_depth():
    """The cut fixture is the catalog entry with 1 decoder layer and 2 Pixtral layers; the whole model is 1.006 B
    parameters on the meta device (a tied 151,936 × 1,024 head)."""
    full, cut = catalog()[HUB]["config"], json.loads(CUT.read_text())
    strip = lambda c: {**c, "text_config": {**c["text_config"], "num_hidden_layers": None},  # noqa: E731
                       "vision_config": {**c["vision_config"], "num_hidden_layers": None}}
    assert strip(full) == strip(cut)
    spec = resolve_model(HUB)
    assert spec.num_params + spec.vision.num_params == 1_005_647_872


@pytest.mark.parametrize(("hw", "grid", "tokens"), [
    # 1540×1540 fits: 110 × 110 patches, 55 × 55 merged blocks, one token each
    ((1540, 1540), (110, 110), 55 * 55),
    # 3000×2000: ratio 3000 / 1540, floor → 1540 × 1026; 1026 rounded up to 14 · 74 = 1036; 55 × 37 blocks
    ((3000, 2000), (110, 74), 55 * 37),
    # 448×658 fits: 32 × 47 patches (658 = 14 · 47); the odd last column is dropped by the merger's unfold: 16 × 23
    ((448, 658), (32, 47), 16 * 23),
])
def test_resize_and_tokens_by_hand_and_by_transformers(hw, grid, tokens):
    import numpy as np
    from transformers.models.pixtral.image_processing_pil_pixtral import get_resize_output_image_size

    v = resolve_model(str(CUT)).vision
    h, w = hw
    assert v.grid(h, w) == grid and v.image_tokens(h, w) == tokens and v.merged_tokens(h, w) == tokens
    # the image processor at its own patch_size (14): LightOnOcrProcessor passes it none
    rh, rw = get_resize_output_image_size(np.zeros((3, h, w)), size=(1540, 1540), patch_size=(14, 14),
                                          input_data_format="channels_first")
    assert (rh // 14, rw // 14) == grid
    # LightOnOcrProcessor.replace_image_token: (height // 28) · (width // 28)
    assert (rh // 28) * (rw // 28) == tokens

    class Train:
        image_height, image_width, images_per_example = h, w, 1
    g = image_geometry(Train, v)
    assert (g.grid_thw, g.patches, g.tokens) == ((1, *grid), grid[0] * grid[1], tokens)

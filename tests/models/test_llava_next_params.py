"""LLaVA-NeXT's parts as hpcmem counts them (hpcmem.models.llava_next, the language model by the mistral family)
against `AutoModelForImageTextToText.from_config` on the meta device: llava-hf/llava-v1.6-mistral-7b-hf's published
config (the catalog's entry) and its widths cut to 1 decoder layer and 4 CLIP layers; the anyres tiles and image tokens
against transformers' own LlavaNextProcessor arithmetic and a hand count."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.job.images import image_geometry
from hpcmem.models.llava_next import llava_next_tower_from_config
from hpcmem.models.resolve import catalog, resolve_model
from tests.helpers.meta_models import meta_image_text_model

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vlm"
HUB = "llava-hf/llava-v1.6-mistral-7b-hf"


@pytest.mark.torch
@pytest.mark.parametrize("name", [HUB, "llava-v1.6-mistral-7b-width-L1-D4.json"])
def test_parts_equal_the_meta_model(name):
    pytest.importorskip("transformers")
    cfg = catalog()[name]["config"] if "/" in name else json.loads((FIXTURES / name).read_text())
    model = meta_image_text_model(cfg)
    assert type(model).__name__ == "LlavaNextForConditionalGeneration"
    count = {"tower": 0, "merger": 0, "newline": 0, "language": 0}
    for param_name, p in model.named_parameters():
        part = ("merger" if ".multi_modal_projector." in param_name else "tower" if ".vision_tower." in param_name
                else "newline" if param_name.endswith("image_newline") else "language")
        count[part] += p.numel()
    v = (spec := resolve_model(name if "/" in name else str(FIXTURES / name))).vision
    assert count == {"tower": v.tower_params, "merger": v.merger_params, "newline": 4096, "language": spec.num_params}
    assert v.num_params == v.tower_params + v.merger_params + 4096


@pytest.mark.parametrize(("hw", "tiles", "tokens"), [
    # 480×640 (h×w): best pinpoint 672×672 (scale 1.05 keeps all 307,200 px; 336×672 keeps 448·336 = 150,528): 2×2 tiles
    # + base; grid 48×48, the image scaled to 48 × 36 rows → (48 − 36) // 2 = 6 padding rows off each side:
    # 36·48 unpadded + 36 newlines + 576 base = 2,340
    ((480, 640), 5, 36 * 48 + 36 + 576),
    # 336×672: pinpoint 336×672 exactly, 1×2 tiles + base; grid 24×48, no padding: 24·48 + 24 + 576 = 1,752
    ((336, 672), 3, 24 * 48 + 24 + 576),
])
def test_anyres_geometry_by_hand_and_by_the_processor(hw, tiles, tokens):
    from transformers.models.llava_next.modeling_llava_next import image_size_to_num_patches
    from transformers.models.llava_next.processing_llava_next import LlavaNextProcessor

    v = resolve_model(HUB).vision
    h, w = hw
    assert (v.anyres_tiles(h, w), v.anyres_tokens(h, w)) == (tiles, tokens)
    pins = [list(p) for p in v.grid_pinpoints]
    assert image_size_to_num_patches((h, w), pins, 336) == tiles
    # the processor's own count (num_additional_image_tokens 1, then "default" drops the class token)
    proc = LlavaNextProcessor.__new__(LlavaNextProcessor)
    proc.image_processor, proc.patch_size, proc.num_additional_image_tokens = type("P", (), {
        "image_grid_pinpoints": pins})(), 14, 1
    assert proc._get_number_of_features(h, w, 336, 336) - 1 == tokens

    class Train:
        image_height, image_width = h, w
    g = image_geometry(Train, v)
    assert (g.grid_thw, g.patches, g.tokens) == ((tiles, 24, 24), tiles * 576, tokens)


def test_pinpoints_that_do_not_tile_are_refused():
    cfg = json.loads((FIXTURES / "llava-v1.6-mistral-7b-width-L1-D4.json").read_text())
    with pytest.raises(SpecError, match=r"image_grid_pinpoints \[\[300, 672\]\] are not multiples"):
        llava_next_tower_from_config({**cfg, "image_grid_pinpoints": [[300, 672], [672, 336]]}, "m")

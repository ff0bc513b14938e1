"""LLaVA-OneVision's parts as hpcmem counts them (hpcmem.models.llava_onevision, the language model by the qwen2
family) against `AutoModelForImageTextToText.from_config` on the meta device: llava-onevision-qwen2-7b's widths cut to
1 decoder layer and 4 SigLIP layers, LlavaOnevisionConfig's own defaults (26 SigLIP layers, a default Qwen2) and the
catalog's llava-hf/llava-onevision-qwen2-7b-ov-hf (whose cut the fixture is: the same but for the layer counts); the
anyres tiles and image tokens (anyres_max_9's downscaling among them) against transformers' own
LlavaOnevisionProcessor and modeling arithmetic and a hand count; what is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.job.images import image_geometry
from hpcmem.models.llava_onevision import onevision_tower_from_config
from hpcmem.models.resolve import catalog, resolve_model
from tests.helpers.meta_models import meta_image_text_model

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vlm"
CUT = FIXTURES / "llava-onevision-qwen2-7b-width-L1-D4.json"
HUB = "llava-hf/llava-onevision-qwen2-7b-ov-hf"


@pytest.mark.torch
@pytest.mark.parametrize("cfg", [json.loads(CUT.read_text()), {"model_type": "llava_onevision"},
                                 catalog()[HUB]["config"]], ids=["width-L1-D4", "class-defaults", "7b-ov"])
def test_parts_equal_the_meta_model(cfg, tmp_path):
    pytest.importorskip("transformers")
    model = meta_image_text_model(cfg)
    assert type(model).__name__ == "LlavaOnevisionForConditionalGeneration"
    count = {"tower": 0, "merger": 0, "newline": 0, "language": 0}
    for param_name, p in model.named_parameters():
        part = ("merger" if ".multi_modal_projector." in param_name else "tower" if ".vision_tower." in param_name
                else "newline" if param_name.endswith("image_newline") else "language")
        count[part] += p.numel()
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    spec = resolve_model(str(path))
    v, width = spec.vision, model.config.text_config.hidden_size
    assert count == {"tower": v.tower_params, "merger": v.merger_params, "newline": width,
                     "language": spec.num_params}
    # no class token, no pre-norm: the patch embedding with bias and a 27² = 729-row position table at 384 px / 14 px
    h = model.config.vision_config.hidden_size
    assert v.embed_params == 3 * 14 * 14 * h + h + 729 * h
    assert v.num_params == v.tower_params + v.merger_params + width


@pytest.mark.parametrize(("hw", "tiles", "tokens"), [
    # 384×768 (h×w): pinpoint 384×768 exactly, 1×2 tiles + base; grid 27×54, no padding: 27·54 + 27 + 729 = 2,214
    ((384, 768), 3, 27 * 54 + 27 + 729),
    # 1152×1536: pinpoint 1152×1536, 3×4 tiles + base; grid 81×108 = 8,748 patches > 1.1² × 9 × 729, so
    # ratio = sqrt(8748 / 6561) = 1.1547 and the grid becomes int(81 // 1.1547) × int(108 // 1.1547) = 70 × 93:
    # 6,510 + 70 newlines + 729 = 7,309
    ((1152, 1536), 13, 70 * 93 + 70 + 729),
    # 500×700: pinpoint 768×768 (the least wasted area of those that keep all 350,000 px: scale min(768/700,
    # 768/500) = 1.097), 2×2 tiles + base; grid 54×54, the image 700 wide: int(round(500 · 54 / 700)) = 38 rows kept
    # (54 − (54 − 38) // 2 · 2 = 38); 38·54 = 2,052 < 1.1² × 6,561: no downscaling; 2,052 + 38 + 729 = 2,819
    ((500, 700), 5, 38 * 54 + 38 + 729),
])
def test_anyres_geometry_by_hand_and_by_transformers(hw, tiles, tokens):
    from transformers.models.llava_onevision.modeling_llava_onevision import image_size_to_num_patches
    from transformers.models.llava_onevision.processing_llava_onevision import LlavaOnevisionProcessor

    v = resolve_model(str(CUT)).vision
    h, w = hw
    assert (v.anyres_tiles(h, w), v.anyres_tokens(h, w)) == (tiles, tokens)
    pins = [list(p) for p in v.grid_pinpoints]
    assert image_size_to_num_patches((h, w), pins, 384) == tiles
    proc = LlavaOnevisionProcessor.__new__(LlavaOnevisionProcessor)
    proc.image_processor = type("P", (), {"image_grid_pinpoints": pins})()
    proc.num_image_tokens, proc.vision_aspect_ratio = 729, "anyres_max_9"
    assert proc._get_number_of_features(h, w, 384, 384) == tokens

    class Train:
        image_height, image_width, images_per_example = h, w, 1
    g = image_geometry(Train, v)
    assert (g.grid_thw, g.patches, g.tokens) == ((tiles, 27, 27), tiles * 729, tokens)


def test_the_fixture_is_the_catalog_entry_cut():
    """The cut fixture the case matrices trace has the catalog entry's widths, pinpoints and vocab."""
    full, cut = catalog()[HUB]["config"], json.loads(CUT.read_text())
    assert resolve_model(HUB).vision.grid_pinpoints == resolve_model(str(CUT)).vision.grid_pinpoints
    for key in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "vocab_size"):
        assert full["text_config"][key] == cut["text_config"][key], key
    for key in ("hidden_size", "intermediate_size", "num_attention_heads", "image_size", "patch_size"):
        assert full["vision_config"][key] == cut["vision_config"][key], key
    assert (full["text_config"]["num_hidden_layers"], full["vision_config"]["num_hidden_layers"]) == (28, 26)
    # the full-depth case matrix (estimator/cases/vlm-llava-onevision-7b.yaml) traces the catalog entry itself
    assert json.loads((FIXTURES / "llava-onevision-qwen2-7b-ov-hf.json").read_text()) == full


def test_an_image_of_a_multi_image_row_is_one_tile():
    """batch_num_images > 1: the image processor pads each image to a square and resizes it to one 384 px tile
    (`need_patching` false), and the processor writes num_image_tokens + 1 (the newline) tokens for it."""
    v = resolve_model(str(CUT)).vision

    class Train:
        image_height, image_width, images_per_example = 1152, 1536, 2
    g = image_geometry(Train, v)
    assert (g.grid_thw, g.patches, g.tokens) == ((1, 27, 27), 729, 730)


def test_what_is_refused():
    cfg = json.loads(CUT.read_text())
    with pytest.raises(SpecError, match="vision_feature_select_strategy 'default': LlavaOnevisionModel"):
        onevision_tower_from_config({**cfg, "vision_feature_select_strategy": "default"}, "m")
    with pytest.raises(SpecError, match="vision_aspect_ratio 'anyres': pack_image_features"):
        onevision_tower_from_config({**cfg, "vision_aspect_ratio": "anyres"}, "m")
    with pytest.raises(SpecError, match="vision_use_head true"):
        onevision_tower_from_config({**cfg, "vision_config": {**cfg["vision_config"], "vision_use_head": True}}, "m")
    with pytest.raises(SpecError, match=r"image_grid_pinpoints \[\[400, 768\]\] are not multiples"):
        onevision_tower_from_config({**cfg, "image_grid_pinpoints": [[400, 768], [384, 384]]}, "m")

"""InternVL's parts as hpcmem counts them (hpcmem.models.internvl, the language model by the qwen2 family) against
`AutoModelForImageTextToText.from_config` on the meta device: InternVL3-8B's widths cut to 1 decoder layer and 2
InternViT layers, and variants that switch on what the published configs leave off (RMSNorm, qk-norm, a mask token,
no mean pooling, no position table, no q/k/v bias, a downsample_ratio of 1/4, tied embeddings, and the outer config
naming no tie_word_embeddings: InternVLConfig's True ties them whatever text_config names); the tiles and image
tokens against transformers' own GotOcr2ImageProcessorPil and a hand count; the catalog's OpenGVLab/InternVL3-8B-hf
(whose cut the fixture is: the same widths, its layer counts cut); what is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.job.images import image_geometry
from hpcmem.models.internvl import internvl_tiles, internvl_tower_from_config
from hpcmem.models.resolve import catalog, resolve_model
from tests.helpers.meta_models import meta_image_text_model, meta_part_counts

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vlm"
CUT = FIXTURES / "internvl3-8b-width-L1-D2.json"
HUB = "OpenGVLab/InternVL3-8B-hf"


def _variant(name: str) -> dict:
    if name == HUB:
        return catalog()[HUB]["config"]
    cfg = json.loads(CUT.read_text())
    vc = cfg["vision_config"]
    if name == "rms-qk-mask":
        vc.update(norm_type="rms_norm", use_qk_norm=True, use_mask_token=True)
    elif name == "no-pooling-no-positions-tied":
        vc.update(use_mean_pooling=False, use_absolute_position_embeddings=False)
        cfg["tie_word_embeddings"] = True
        cfg["text_config"].pop("tie_word_embeddings")
    elif name == "text-untied-outer-unnamed":
        # the converted checkpoints' layout: text_config names false, the outer config nothing (InternVLConfig's True)
        cfg.pop("tie_word_embeddings")
    elif name == "no-qkv-bias-quarter-224":
        vc.update(attention_bias=False, image_size=[224, 224])
        cfg["downsample_ratio"] = 0.25
    return cfg


@pytest.mark.torch
@pytest.mark.parametrize("name", ["width-L1-D2", "rms-qk-mask", "no-pooling-no-positions-tied",
                                  "text-untied-outer-unnamed", "no-qkv-bias-quarter-224", HUB])
def test_parts_equal_the_meta_model(name, tmp_path):
    pytest.importorskip("transformers")
    cfg = _variant(name)
    model = meta_image_text_model(cfg)
    assert type(model).__name__ == "InternVLForConditionalGeneration"
    count = meta_part_counts(model)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    spec = resolve_model(str(path))
    v = spec.vision
    assert count == {"tower": v.tower_params, "merger": v.merger_params, "language": spec.num_params}
    assert v.num_params == v.tower_params + v.merger_params


def test_the_published_widths_by_hand():
    """InternViT-300M at 448 px / 14 px: a class token, a Conv2d with bias, 32² + 1 positions; a layer's six linears
    (q/k/v with bias), two LayerNorms and two layer-scale vectors; the projector's LayerNorm over 4 · 1024."""
    v = internvl_tower_from_config(json.loads(CUT.read_text()), "cut")
    h, i, o = 1024, 4096, 3584
    assert v.embed_params == h + 3 * 14 * 14 * h + h + 1025 * h
    assert v.block_params == 4 * (h * h + h) + 2 * h * i + i + h + 4 * h + 2 * h
    assert v.merger_params == 2 * 4 * h + 4 * h * o + o + o * o + o
    assert v.tokens_per_image == 256 and v.positions == 1025


@pytest.mark.parametrize(("hw", "tiles"), [
    ((448, 448), 1),            # aspect 1: the 1×1 canvas, no thumbnail
    ((448, 896), 3),            # w/h 2: 2 columns × 1 row, + thumbnail
    ((480, 640), 13),           # 4/3: the 4 × 3 canvas matches exactly: 12 tiles + thumbnail
    ((800, 1200), 7),           # 3/2: 3 × 2 tiles + thumbnail
    ((1080, 1920), 9),          # 16/9 ≈ 1.78: 2×1 (2.0, diff .22) vs 4×2 (.22): tie, area 2,073,600 > half of 8
                                # tiles' 802,816 → 4 × 2 + thumbnail
])
def test_tiles_equal_the_image_processor(hw, tiles):
    pytest.importorskip("transformers")
    import numpy as np
    from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import GotOcr2ImageProcessorPil

    proc = GotOcr2ImageProcessorPil(size={"height": 448, "width": 448}, crop_to_patches=True, min_patches=1,
                                    max_patches=12)
    image = np.zeros((hw[0], hw[1], 3), dtype=np.uint8)
    out = proc(images=[image], return_tensors="np")
    n = int(out["num_patches"][0])
    assert out["pixel_values"].shape == (n, 3, 448, 448)
    assert internvl_tiles(hw[0], hw[1], 448, 1, 12, True)[0] == n == proc.get_number_of_image_patches(*hw) == tiles


def test_geometry_and_tokens():
    from hpcmem.job.jobspec import TrainSpec

    v = internvl_tower_from_config(json.loads(CUT.read_text()), "cut")
    t = TrainSpec(trainer="sft", images_per_example=1, image_height=800, image_width=1200)
    g = image_geometry(t, v)
    assert (g.grid_thw, g.patches, g.tokens, g.resized) == ((7, 32, 32), 7 * 1024, 7 * 256, (896, 1344))
    one = internvl_tower_from_config({**json.loads(CUT.read_text()), "crop_to_patches": False}, "cut")
    assert image_geometry(t, one).tokens == 256


@pytest.mark.parametrize(("change", "words"), [
    ({"vision_config": {"model_type": "clip_vision_model"}}, "not modelled"),
    ({"vision_config": {"image_size": [448, 224]}}, "square"),
    ({"vision_feature_layer": [-1, -2]}, "one feature layer"),
    ({"downsample_ratio": 0}, "downsample_ratio"),
])
def test_refused(change, words):
    cfg = {"model_type": "internvl", **change}
    with pytest.raises(SpecError, match=words):
        internvl_tower_from_config(cfg, "x")

"""Llama-3.2-Vision's parts as hpcmem counts them (hpcmem.models.mllama; the decoder by the llama family) against
`AutoModelForImageTextToText.from_config` on the meta device — the catalog's meta-llama/Llama-3.2-11B-Vision-Instruct
and its widths cut to 3 decoder layers (one cross-attention layer) and 5 + 2 vision layers — and the processor's
tiles against transformers' own MllamaImageProcessorPil."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.models.mllama import mllama_tiles, mllama_tower_from_config
from hpcmem.models.resolve import catalog, resolve_model
from tests.helpers.meta_models import meta_image_text_model, meta_part_counts

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vlm"
MLLAMA = ["meta-llama/Llama-3.2-11B-Vision-Instruct", "mllama-11b-width-L3-D5G2.json"]


@pytest.mark.torch
@pytest.mark.parametrize("name", MLLAMA)
def test_parts_equal_the_meta_model(name):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    cfg = catalog()[name]["config"] if "/" in name else json.loads((FIXTURES / name).read_text())
    model = meta_image_text_model(cfg)
    assert type(model).__name__ == "MllamaForConditionalGeneration"
    count = meta_part_counts(model, tower=".vision_model.")
    spec = resolve_model(name if "/" in name else str(FIXTURES / name))
    v = spec.vision
    assert count == {"tower": v.tower_params, "merger": v.merger_params,
                     "language": spec.num_params + v.text_extra_params}
    if "/" in name:     # the published total (the model card's 10.6 B; 10,670,220,835 on the meta device)
        assert spec.num_params + v.num_params == sum(count.values()) == 10_670_220_835
    linears = {n.split("vision_model.", 1)[1].split(".", 1)[1] for n, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and ".vision_model." in n}
    ours = {f"layers.{i}.{x.name}" for x in v.linears() if x.part == "tower" for i in range(v.depth)}
    ours |= {f"layers.{i}.{x.name}" for x in v.linears() if x.part == "tower" for i in range(v.global_depth)}
    assert linears == ours


# (height, width) → (rows, cols), worked by hand from get_optimal_tiled_canvas's rule at 560-px tiles, 4 tiles at most:
# 560×560 fits (1, 1) at scale 1; 1120×1120 fits (2, 2) at scale 1; 300×1200: every canvas upscales, the least is
# (1, 3) at min(560/300, 1680/1200) = 1.4 (and (1, 4) 1.87, (2, 2) 0.93 < 1 is not an upscale: 1.4 is the least ≥ 1);
# 2000×600: no canvas upscales, the largest downscale is (4, 1) min(2240/2000, 560/600) = 0.93 vs (3, 1) 0.84;
# 600×1100: only (2, 2) upscales, min(1120/600, 1120/1100) = 1.02 ((1, 2): min(0.93, 1.02) = 0.93)
TILES = [((560, 560), (1, 1)), ((1120, 1120), (2, 2)), ((300, 1200), (1, 3)), ((2000, 600), (4, 1)),
         ((100, 100), (1, 1)), ((600, 1100), (2, 2)), ((1, 4000), (1, 4))]


@pytest.mark.parametrize("size, grid", TILES)
def test_tiles_by_hand(size, grid):
    assert mllama_tiles(*size, tile=560, max_tiles=4) == grid


@pytest.mark.torch
def test_tiles_match_the_image_processor():
    """MllamaImageProcessorPil on blank images: num_tiles is rows · cols and aspect_ratio_ids names (rows, cols) in
    supported_aspect_ratios (1-based); pixel_values always hold max_image_tiles tiles."""
    pytest.importorskip("transformers")
    from PIL import Image
    from transformers.models.mllama.image_processing_pil_mllama import MllamaImageProcessorPil

    supported = mllama_tower_from_config({"model_type": "mllama"}, "m")
    ratios = [[1, 1], [1, 2], [1, 3], [1, 4], [2, 1], [2, 2], [3, 1], [4, 1]]
    proc = MllamaImageProcessorPil(size={"height": 560, "width": 560}, max_image_tiles=4)
    for (h, w), _ in TILES + [((480, 640), None), ((1024, 768), None)]:
        out = proc([[Image.new("RGB", (w, h))]], return_tensors="np")
        rows, cols = mllama_tiles(h, w, tile=560, max_tiles=supported.max_num_tiles)
        assert out["num_tiles"] == [[rows * cols]]
        assert ratios[int(out["aspect_ratio_ids"][0, 0]) - 1] == [rows, cols]
        assert out["pixel_values"].shape == (1, 1, 4, 3, 560, 560)


def test_vision_output_dim_must_be_the_concatenation():
    with pytest.raises(SpecError, match="vision_output_dim 7000 must be hidden_size 1280 × \\(1 \\+ 5"):
        mllama_tower_from_config({"model_type": "mllama", "vision_config": {"vision_output_dim": 7000}}, "m")


def test_the_traced_fixture_is_the_catalog_entry():
    """estimator/cases/vlm-mllama-11b.yaml traces tests/fixtures/vlm/Llama-3.2-11B-Vision-Instruct.json: the
    catalog's config, key for key."""
    fixture = json.loads((FIXTURES / "Llama-3.2-11B-Vision-Instruct.json").read_text())
    assert fixture == catalog()["meta-llama/Llama-3.2-11B-Vision-Instruct"]["config"]

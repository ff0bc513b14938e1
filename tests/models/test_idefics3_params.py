"""SmolVLM's parts as hpcmem counts them (hpcmem.models.idefics3, the language model by the llama family) against
`AutoModelForImageTextToText.from_config` on the meta device: HuggingFaceTB/SmolVLM2-500M-Video-Instruct's config
(tests/fixtures/vlm, written from its published config.json values) and its widths cut to 1 decoder layer and 3 vision
layers, and the catalog's entry; Idefics3 at its class defaults; the processor's tiles by hand and against
transformers' own image processor."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from hpcmem.errors import SpecError
from hpcmem.job.images import image_geometry
from hpcmem.models.idefics3 import idefics3_tiles, idefics3_tower_from_config
from hpcmem.models.resolve import catalog, resolve_model
from tests.helpers.meta_models import meta_image_text_model, meta_part_counts

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vlm"
SMOLVLM = ["SmolVLM2-500M-Video-Instruct.json", "smolvlm2-500m-width-L1-D3.json",
           "HuggingFaceTB/SmolVLM2-500M-Video-Instruct"]


def _images(height: int, width: int) -> SimpleNamespace:
    return SimpleNamespace(image_height=height, image_width=width, min_pixels=None, max_pixels=None)


@pytest.mark.torch
@pytest.mark.parametrize("name", SMOLVLM)
def test_parts_equal_the_meta_model(name):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    cfg = catalog()[name]["config"] if "/" in name else json.loads((FIXTURES / name).read_text())
    model = meta_image_text_model(cfg)
    assert type(model).__name__ == "SmolVLMForConditionalGeneration"
    count = meta_part_counts(model, tower=".vision_model.", merger=".connector.")
    spec = resolve_model(name if "/" in name else str(FIXTURES / name))
    assert count == {"tower": spec.vision.tower_params, "merger": spec.vision.merger_params,
                     "language": spec.num_params}
    linears = {n.split("model.", 1)[1] for n, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and (".vision_model." in n or ".connector." in n)}
    ours = {f"vision_model.encoder.layers.{i}.{x.name}" for x in spec.vision.linears() if x.part == "tower"
            for i in range(x.count)}
    ours |= {f"connector.{x.name}" for x in spec.vision.linears() if x.part == "merger"}
    assert linears == ours


@pytest.mark.torch
def test_idefics3_at_its_class_defaults_equals_the_meta_model():
    pytest.importorskip("transformers")
    cfg = {"model_type": "idefics3", "text_config": {"num_hidden_layers": 1}, "vision_config": {"num_hidden_layers": 2}}
    model = meta_image_text_model(cfg)
    assert type(model).__name__ == "Idefics3ForConditionalGeneration"
    vision = idefics3_tower_from_config(cfg, "idefics3")
    tower = sum(p.numel() for n, p in model.named_parameters() if ".vision_model." in n)
    connector = sum(p.numel() for n, p in model.named_parameters() if ".connector." in n)
    assert (tower, connector) == (vision.tower_params, vision.merger_params)


def test_the_published_500m_by_hand():
    """SigLIP base-patch16-512 (the class's 12 layers, 3072 MLP width): per layer 2 LayerNorms of 768 (weight, bias),
    q/k/v/out_proj 768² + bias, fc1/fc2 768 ↔ 3072 + bias; a 3·16²·768 patch embedding with bias, (512/16)² = 1024
    positions, post_layernorm. The connector: 768 · 4² = 12,288 → 960, no bias. The whole model: 507,482,304 (the
    model card's "500M")."""
    v = resolve_model(str(FIXTURES / "SmolVLM2-500M-Video-Instruct.json")).vision
    layer = 2 * 2 * 768 + 4 * (768 * 768 + 768) + (768 * 3072 + 3072) + (3072 * 768 + 768)
    tower = 3 * 16 * 16 * 768 + 768 + 1024 * 768 + 12 * layer + 2 * 768
    assert (v.tower_params, v.merger_params) == (tower, 12_288 * 960) == (86_433_024, 11_796_480)
    assert (v.tile, v.longest_edge, v.scale_factor, v.tokens_per_tile) == (512, 2048, 4, 64)
    assert v.num_params + resolve_model(str(FIXTURES / "SmolVLM2-500M-Video-Instruct.json")).num_params == 507_482_304


def test_a_480x640_image_by_hand():
    """longest_edge 2048, 512-px tiles (SmolVLMImageProcessorPil._preprocess): 640 ≥ 480, so the width becomes 2048
    and the height int(2048 / (640/480)) = 1536 (even); rounded up to multiples of 512: 2048 × 1536, so 3 rows × 4 cols
    of tiles and the global one: 13 tiles of (512/16)² = 1,024 patches, 1,024 / 4² = 64 tokens each. At longest_edge
    1024: 1024 × 768 → 1024 × 1024 (ceil), 2 × 2 + 1 = 5 tiles. A 512 × 512 image at 2048: 4 × 4 + 1 = 17 tiles. An
    image no larger than one tile after both resizes is one tile: longest_edge 512 → one tile, no global."""
    v = resolve_model(str(FIXTURES / "smolvlm2-500m-width-L1-D3.json")).vision
    g = image_geometry(_images(480, 640), v)
    assert (g.resized, g.grid_thw, g.patches, g.tokens) == ((1536, 2048), (13, 32, 32), 13 * 1024, 13 * 64)
    assert idefics3_tiles(480, 640, 1024, 512) == ((1024, 1024), 2, 2)
    assert idefics3_tiles(512, 512, 2048, 512) == ((2048, 2048), 4, 4)
    assert idefics3_tiles(300, 1000, 512, 512) == ((512, 512), 0, 0)


@pytest.mark.torch
@pytest.mark.parametrize("edge", [2048, 1024])
@pytest.mark.parametrize("size", [(480, 640), (1000, 300), (100, 100), (513, 2), (5000, 3000)])
def test_tiles_match_the_image_processor(edge, size):
    pytest.importorskip("PIL")
    from PIL import Image
    from transformers.models.smolvlm.image_processing_pil_smolvlm import SmolVLMImageProcessorPil

    height, width = size
    processor = SmolVLMImageProcessorPil(size={"longest_edge": edge}, max_image_size={"longest_edge": 512})
    out = processor(images=[[Image.new("RGB", (width, height))]], return_tensors="np", return_row_col_info=True)
    _, rows, cols = idefics3_tiles(height, width, edge, 512)
    assert (rows, cols) == (out["rows"][0][0], out["cols"][0][0])
    assert out["pixel_values"].shape[1] == (rows * cols + 1 if rows else 1)


def test_a_tile_the_connector_cannot_fold_is_named():
    """(512 / 16) = 32 patches a side: scale_factor 3 does not divide it (pixel_shuffle's view fails), 4 does."""
    cfg = {"model_type": "smolvlm", "scale_factor": 3, "vision_config": {"image_size": 512, "patch_size": 16}}
    assert "multiple of scale_factor 3" in idefics3_tower_from_config(cfg, "m").fold_problem
    assert idefics3_tower_from_config({**cfg, "scale_factor": 4}, "m").fold_problem is None


def test_a_non_square_image_size_is_refused():
    cfg = {"model_type": "smolvlm", "vision_config": {"image_size": [512, 384]}}
    with pytest.raises(SpecError, match="square tiles"):
        idefics3_tower_from_config(cfg, "m")

"""llava's parts as hpcmem counts them (hpcmem.models.clip_tower, the language model by the llama family) against
`AutoModelForImageTextToText.from_config` on the meta device: llava-hf/llava-1.5-7b-hf's public config (a fixture
written from its config.json values) and the same widths cut to 1 decoder layer and 4 CLIP layers, the catalog's entry; the image
geometry by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.job.images import image_geometry
from hpcmem.models.clip_tower import clip_tower_from_config
from hpcmem.models.resolve import catalog, resolve_model
from tests.helpers.meta_models import meta_image_text_model, meta_part_counts

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vlm"
LLAVA = ["llava-1.5-7b-hf.json", "llava-1.5-7b-width-L1-D4.json", "llava-hf/llava-1.5-7b-hf"]


def _config(name: str) -> dict:
    return catalog()[name]["config"] if "/" in name else json.loads((FIXTURES / name).read_text())


def _path(name: str) -> str:
    return name if "/" in name else str(FIXTURES / name)


@pytest.mark.torch
@pytest.mark.parametrize("name", LLAVA)
def test_parts_equal_the_meta_model(name):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    cfg = _config(name)
    model = meta_image_text_model(cfg)
    assert type(model).__name__ == "LlavaForConditionalGeneration"
    count = meta_part_counts(model)
    spec = resolve_model(_path(name))
    assert count == {"tower": spec.vision.tower_params, "merger": spec.vision.merger_params,
                     "language": spec.num_params}
    linears = {n.split("model.", 1)[1] for n, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and (".vision_tower." in n or ".multi_modal_projector." in n)}
    ours = {f"vision_tower.encoder.layers.{i}.{x.name}" for x in spec.vision.linears() if x.part == "tower"
            for i in range(x.count)}
    ours |= {f"multi_modal_projector.{x.name}" for x in spec.vision.linears() if x.part == "merger"}
    assert linears == ours


def test_the_published_7b_by_hand():
    """CLIP ViT-L/14-336: 24 layers of width 1024 (4 linears 1024² + bias, fc1/fc2 1024 ↔ 4096 + bias, 2 LayerNorms),
    a 3·14²·1024 patch embedding, a class embedding, 577 positions, pre/post LayerNorm; the projector 1024 → 4096 →
    4096 with biases; vision_feature_layer -2 leaves the last layer and post_layernorm off the loss's path."""
    v = resolve_model(str(FIXTURES / "llava-1.5-7b-hf.json")).vision
    layer = 4 * (1024 * 1024 + 1024) + (1024 * 4096 + 4096) + (4096 * 1024 + 1024) + 4 * 1024
    embeddings = 3 * 14 * 14 * 1024 + 1024 + 577 * 1024
    assert v.tower_params == embeddings + 2 * 2 * 1024 + 24 * layer == 303_507_456
    assert v.merger_params == (1024 * 4096 + 4096) + (4096 * 4096 + 4096)
    assert v.trained_layers == 23
    assert v.unused_params == layer + 2 * 1024
    assert (v.positions, v.tokens_per_image, v.patch_dim) == (577, 576, 588)


@pytest.mark.torch
@pytest.mark.parametrize(("height", "width"), [(336, 336), (1000, 500), (64, 2000)])
def test_one_resolution_whatever_the_image(height, width):
    """transformers' LlavaProcessor around CLIPImageProcessorPil (the published preprocessor: shortest edge 336, centre
    crop 336) turns any image into [3, 336, 336] and 576 image tokens ((336 / 14)², the class token dropped), as
    image_geometry says."""
    pytest.importorskip("transformers")
    from PIL import Image

    from hpcmem.trace.vision import processor
    from hpcmem.trace.vision_llava import IMAGE_TOKEN
    from hpcmem.validate.cases import case_job

    job = case_job({"trainer": "sft", "model_name_or_path": str(FIXTURES / "llava-1.5-7b-hf.json"),
                    "images_per_example": 1, "image_height": height, "image_width": width, "max_length": 1024})
    proc = processor(job)
    out = proc(images=[Image.new("RGB", (width, height))], text=[IMAGE_TOKEN], return_tensors="pt")
    tokens = int((out["input_ids"] == proc.tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)).sum())
    g = image_geometry(job.train, job.model.vision)
    assert tuple(out["pixel_values"].shape) == (1, 3, *g.resized) == (1, 3, 336, 336)
    assert tokens == g.tokens == g.patches == 576


def test_a_feature_layer_hpcmem_does_not_model_is_one_line():
    cfg = json.loads((FIXTURES / "llava-1.5-7b-hf.json").read_text())
    with pytest.raises(SpecError, match="vision_feature_layer"):
        clip_tower_from_config({**cfg, "vision_feature_layer": [-2, -5]}, "x")
    with pytest.raises(SpecError, match="vision_feature_layer 0"):
        clip_tower_from_config({**cfg, "vision_feature_layer": 0}, "x")

"""Inkling 2's parts as hpcmem counts them (its tower and merger in hpcmem.models.inkling2, the language model from
the learned profile of its inkling2_text config, hpcmem.models.vlm_learned) against
`AutoModelForImageTextToText.from_config` on the meta device, on the cut of estimator/cases/vlm-inkling2.yaml; peft's
all-linear targets on that model; the cells, patches and image tokens of a picture as transformers' own
`Inkling2ImageProcessor._preprocess` and `Inkling2Processor` make them (the image processor's module imports
torchvision at its top: loaded here over a stand-in module that only satisfies that import, its `_preprocess` run
with torch pad/normalize for the two TorchvisionBackend methods it calls)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate.vision import vision_adapters
from hpcmem.job.images import image_geometry
from hpcmem.models.inkling2 import inkling2_grid, inkling2_tower_from_config
from hpcmem.models.resolve import resolve_model
from hpcmem.validate.cases import case_job
from tests.helpers.meta_models import meta_image_text_model, meta_part_counts, peft_all_linear_targets
from tests.helpers.torchvision_stand_in import real_image_processor_class, torch_backend
from tests.helpers.vlm_cuts import assert_refused_without_text_profile

# transformers' own image processor, run over a torchvision stand-in (tests.helpers.torchvision_stand_in)
PROCESSOR = ("transformers.models.inkling2.image_processing_inkling2", "Inkling2ImageProcessor")

CUT = Path(__file__).resolve().parents[1] / "fixtures" / "vlm" / "inkling2-defaults-L2-D2.json"


def _job(height: int, width: int, **extra):
    return case_job({"trainer": "sft", "model_name_or_path": str(CUT), "max_length": 4096, "images_per_example": 1,
                     "image_height": height, "image_width": width, "dtype": "bfloat16", "bf16": True, **extra})


def _vision_name(name: str) -> str | None:
    """A meta model module's name as hpcmem's TowerLinear names it: below `vision_tower.layers.N.` as
    `blocks.N.<name>`, the patch embedding and the merger's linears by their last name; None elsewhere."""
    if "vision_tower.layers." in name:
        return "blocks." + name.split("vision_tower.layers.", 1)[1]
    if "vision_tower." in name:
        return name.rsplit(".", 1)[1]
    return None


def test_the_parts_by_hand():
    """configuration_inkling2.py defaults: width 1024, intermediate int(1024 · 4.0) = 4096, 16 heads, 20 px patches
    (3 · 400 = 1200 values), a 32² position grid. Per layer: q/k/v/out_proj 4 · (1024² + 1024) = 4,198,400, fc1
    1024 · 4096 + 4096 = 4,198,400, fc2 4096 · 1024 + 1024 = 4,195,328, two LayerNorms and lambda_1, lambda_2
    6 · 1024 = 6,144: 12,598,272. Embeddings 1200 · 1024 + 1024 · 1024 + 2 · 1024 = 2,279,424; pre_layernorm 2,048.
    Merger (projector_bias False): linear_1 4096 · 4096, linear_2 4096 · 4608."""
    spec = resolve_model(str(CUT))
    v = spec.vision
    assert v.block_params == 12_598_272
    assert v.tower_params == 2_279_424 + 2_048 + 2 * 12_598_272
    assert v.merger_params == 4096 * 4096 + 4096 * 4608
    assert spec.tie_word_embeddings is False


@pytest.mark.torch
def test_parts_and_linears_equal_the_meta_model():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    model = meta_image_text_model(json.loads(CUT.read_text()))
    assert type(model).__name__ == "Inkling2ForConditionalGeneration"
    spec = resolve_model(str(CUT))
    count = meta_part_counts(model, tower=".vision_tower.", merger=".vision_tower.merger.")
    assert count == {"tower": spec.vision.tower_params, "merger": spec.vision.merger_params,
                     "language": spec.num_params}
    linears = {_vision_name(n): (m.in_features, m.out_features, m.bias is not None) for n, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and _vision_name(n)}
    ours = {(f"blocks.{i}.{x.name}" if x.part == "tower" else x.name): (x.in_features, x.out_features, x.bias)
            for x in spec.vision.linears() for i in range(x.count)}
    assert linears == ours
    assert spec.tie_word_embeddings is (model.get_output_embeddings().weight is model.get_input_embeddings().weight)
    assert spec.learned is not None


@pytest.mark.torch
def test_peft_all_linear_reaches_what_the_spec_adapts():
    """peft's all-linear on the real model: every nn.Linear but the output embedding, the patch embedding and the
    merger's two among them; its tower targets are hpcmem's `vision_adapters`."""
    pytest.importorskip("torch")
    pytest.importorskip("peft")

    model = meta_image_text_model(json.loads(CUT.read_text()))
    targets = peft_all_linear_targets(model)
    theirs = sorted(n for n in (_vision_name(t) for t in targets) if n)
    job = _job(640, 640, use_peft=True, lora_target_modules="all-linear")
    ours = sorted(f"blocks.{i}.{x.name}" if x.part == "tower" else x.name
                  for x in vision_adapters(job, job.model.vision) for i in range(x.count))
    assert theirs == ours
    assert "lm_head" not in targets


@pytest.mark.torch
@pytest.mark.parametrize(("height", "width", "rows", "cols"),
                         [(640, 640, 16, 16), (960, 1280, 24, 32), (90, 130, 3, 4), (41, 40, 2, 1), (1, 1, 1, 1)])
def test_the_real_preprocess_and_processor_count_the_spec_s_cells(monkeypatch, height, width, rows, cols):
    """The real `_preprocess` on one image: pixel_values [rows · cols, 40, 40, 3] and image_grid_thw [1, rows, cols]
    (by hand: ⌈height / 40⌉, ⌈width / 40⌉); hpcmem.trace.vision's stand-in processor makes the same tensors, and
    `Inkling2Processor` writes rows · cols image tokens and no marker: the spec's tokens, merge² patches each."""
    torch = pytest.importorskip("torch")
    from PIL import Image
    from transformers.image_utils import SizeDict

    from hpcmem.trace.vision import processor

    real = real_image_processor_class(monkeypatch, *PROCESSOR)
    image = torch.full((3, height, width), 7, dtype=torch.uint8)
    out = real._preprocess(torch_backend(), [image], size=SizeDict(height=40, width=40), do_rescale=True,
                           rescale_factor=1 / 255, do_normalize=True, image_mean=[0.5] * 3, image_std=[0.5] * 3,
                           return_tensors="pt")
    assert tuple(out["pixel_values"].shape) == (rows * cols, 40, 40, 3)
    assert out["image_grid_thw"].tolist() == [[1, rows, cols]]
    job = _job(height, width)
    v = job.model.vision
    assert inkling2_grid(height, width) == v.grid(height, width) == (rows, cols)
    proc = processor(job)
    picture = Image.new("RGB", (width, height), (7, 7, 7))
    ours = proc(text=[proc.image_token + " t3"], images=[[picture]], return_tensors="pt")
    assert torch.allclose(ours["pixel_values"], out["pixel_values"])
    assert torch.equal(ours["image_grid_thw"], out["image_grid_thw"])
    g = image_geometry(job.train, v)
    ids = ours["input_ids"][0]
    assert int((ids == proc.image_token_id).sum()) == g.tokens == rows * cols
    assert len(ids) == g.tokens + 1
    assert g.patches == 4 * rows * cols == v.image_patches(height, width)


def test_a_mismatched_text_width_and_cell_are_refused():
    cfg = json.loads(CUT.read_text())
    cfg["vision_config"]["text_hidden_size"] = 4096
    with pytest.raises(SpecError, match="text_hidden_size"):
        inkling2_tower_from_config(cfg, "cut")
    cfg = json.loads(CUT.read_text())
    cfg["vision_config"]["patch_size"] = 16
    with pytest.raises(SpecError, match="must be 40"):
        inkling2_tower_from_config(cfg, "cut")


def test_a_text_config_without_a_learned_profile_is_refused(tmp_path):
    assert_refused_without_text_profile(CUT, tmp_path, num_hidden_layers=3)


def test_pixel_bounds_are_refused():
    with pytest.raises(SpecError, match="Inkling2ImageProcessor has no such setting"):
        _job(640, 640, min_pixels=1000)

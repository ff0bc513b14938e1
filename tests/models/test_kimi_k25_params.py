"""Kimi K2.5's parts as hpcmem counts them (its MoonViT-style tower and multimodal projector in
hpcmem.models.kimi_k25, the language model from the learned profile of its DeepSeek-V3 text config,
hpcmem.models.vlm_learned) against `AutoModelForImageTextToText.from_config` on the meta device, on the cut of
estimator/cases/vlm-kimi-k25.yaml; peft's all-linear targets on that model; the patches and image tokens of a picture
as transformers' Kimi_K25Processor (around hpcmem.trace.vision_kimi_k25's PIL stand-in) makes them, and the stand-in's
grid as transformers' own `navit_resize` and `get_number_of_image_patches` compute it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate.vision import vision_adapters
from hpcmem.job.images import image_geometry
from hpcmem.models.kimi_k25 import kimi_k25_tower_from_config
from hpcmem.models.resolve import resolve_model
from hpcmem.validate.cases import case_job
from tests.helpers.meta_models import meta_image_text_model, meta_part_counts, peft_all_linear_targets
from tests.helpers.vlm_cuts import assert_refused_without_text_profile

CUT = Path(__file__).resolve().parents[1] / "fixtures" / "vlm" / "kimi-k25-defaults-L2-D2.json"
SIZES = [(448, 448), (672, 896), (600, 1000), (1000, 600), (300, 200), (13, 9), (8000, 3000), (2000, 3000),
         (7200, 7300)]


def _job(height: int, width: int, **extra):
    return case_job({"trainer": "sft", "model_name_or_path": str(CUT), "max_length": 4096, "images_per_example": 1,
                     "image_height": height, "image_width": width, "dtype": "bfloat16", "bf16": True, **extra})


def _vision_name(name: str) -> str | None:
    """A meta model module's name as hpcmem's TowerLinear names it: below `vision_tower.layers.N.` as
    `blocks.N.<name>`, below `mm_projector.` as it is; None elsewhere."""
    for prefix in ("vision_tower.layers.", "mm_projector."):
        if prefix in name:
            rest = name.split(prefix, 1)[1]
            return f"blocks.{rest}" if prefix.endswith("layers.") else rest
    return None


def test_the_projector_by_hand():
    """modeling_kimi_k25.py `Kimi_K25MultimodalProjection`: in_proj (4 · 1152 → 4 · 1152), out_proj (→ the text
    width 7168, DeepseekV3Config's); the head tied (Kimi_K25Config.tie_word_embeddings True)."""
    spec = resolve_model(str(CUT))
    by_name = {x.name: (x.in_features, x.out_features) for x in spec.vision.linears()}
    assert by_name["in_proj"] == (4608, 4608) and by_name["out_proj"] == (4608, 7168)
    assert by_name["attn.proj"] == (1152, 1152) and by_name["mlp.fc1"] == (1152, 4304)
    assert spec.tie_word_embeddings is True


@pytest.mark.torch
def test_parts_and_linears_equal_the_meta_model():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    model = meta_image_text_model(json.loads(CUT.read_text()))
    assert type(model).__name__ == "Kimi_K25ForConditionalGeneration"
    spec = resolve_model(str(CUT))
    count = meta_part_counts(model, tower=".vision_tower.", merger=".mm_projector.")
    assert count == {"tower": spec.vision.tower_params, "merger": spec.vision.merger_params,
                     "language": spec.num_params}
    linears = {_vision_name(n): (m.in_features, m.out_features) for n, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and _vision_name(n)}
    ours = {(f"blocks.{i}.{x.name}" if x.part == "tower" else x.name): (x.in_features, x.out_features)
            for x in spec.vision.linears() for i in range(x.count)}
    assert linears == ours
    assert spec.tie_word_embeddings is (model.get_output_embeddings().weight is model.get_input_embeddings().weight)
    assert spec.learned is not None


@pytest.mark.torch
def test_peft_all_linear_reaches_what_the_spec_adapts():
    """peft's all-linear on the real model (peft/tuners/tuners_utils.py `_maybe_include_all_linear_layers`: every
    nn.Linear but the output embedding): its tower and projector targets are hpcmem's `vision_adapters`."""
    pytest.importorskip("torch")
    pytest.importorskip("peft")

    model = meta_image_text_model(json.loads(CUT.read_text()))
    targets = peft_all_linear_targets(model)
    theirs = sorted(n for n in (_vision_name(t) for t in targets) if n)
    job = _job(448, 448, use_peft=True, lora_target_modules="all-linear")
    ours = sorted(f"blocks.{i}.{x.name}" if x.part == "tower" else x.name
                  for x in vision_adapters(job, job.model.vision) for i in range(x.count))
    assert theirs == ours
    assert "lm_head" not in targets


def _navit_resize():
    """transformers' own `navit_resize`, read from image_processing_kimi_k25.py (the module imports torchvision at
    the top, which this environment lacks; the function needs math alone)."""
    import ast
    import importlib.util
    import math

    spec = importlib.util.find_spec("transformers")
    if spec is None:
        pytest.skip("transformers not installed")
    path = Path(spec.origin).parent / "models" / "kimi_k25" / "image_processing_kimi_k25.py"
    tree = ast.parse(path.read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "navit_resize")
    scope = {"math": math}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), str(path), "exec"), scope)  # noqa: S102
    return scope["navit_resize"]


@pytest.mark.parametrize(("height", "width"), SIZES)
def test_the_grid_is_navit_resize_s(height, width):
    """image_processing_kimi_k25.py `navit_resize` (the class defaults: 14 px patches, merge 2, 16,384 patches, 512
    a side) and `Kimi_K25ImageProcessor.get_number_of_image_patches`: the spec's grid."""
    navit_resize = _navit_resize()
    (_, _), (ph, pw) = navit_resize(height, width, patch_size=14, merge_kernel_size=2, max_patches=16384,
                                    max_size_per_side=512)
    v = kimi_k25_tower_from_config(json.loads(CUT.read_text()), "cut")
    assert v.grid(height, width) == (ph // 14, pw // 14)


@pytest.mark.torch
@pytest.mark.parametrize(("height", "width"), [(448, 448), (672, 896), (500, 333)])
def test_the_processor_counts_the_spec_s_image_tokens(height, width):
    """Kimi_K25Processor (hpcmem.trace.vision `processor`, transformers' own class around the PIL stand-in) on one
    image: its image tokens, patches (pixel_values [patches, 3, 14, 14]) and grid are the spec's; nothing around
    them."""
    pytest.importorskip("transformers")
    from PIL import Image
    from transformers.models.kimi_k25.processing_kimi_k25 import Kimi_K25Processor

    from hpcmem.trace.vision import processor

    job = _job(height, width)
    proc = processor(job)
    assert isinstance(proc, Kimi_K25Processor)
    out = proc(text=[proc.image_token + " t3"], images=[[Image.new("RGB", (width, height))]], return_tensors="pt")
    g = image_geometry(job.train, job.model.vision)
    ids = out["input_ids"][0]
    assert int((ids == proc.image_token_id).sum()) == g.tokens
    assert tuple(out["pixel_values"].shape) == (g.patches, 3, 14, 14)
    assert out["image_grid_thw"].tolist() == [list(g.grid_thw)]
    assert len(ids) == g.tokens + 1
    assert {(448, 448): 256, (672, 896): 768, (500, 333): 216}[(height, width)] == g.tokens


def test_a_merge_kernel_other_than_2x2_is_refused():
    cfg = json.loads(CUT.read_text())
    cfg["vision_config"]["merge_kernel_size"] = [3, 3]
    with pytest.raises(SpecError, match="merge_kernel_size"):
        kimi_k25_tower_from_config(cfg, "cut")


def test_a_text_config_without_a_learned_profile_is_refused(tmp_path):
    assert_refused_without_text_profile(CUT, tmp_path, num_hidden_layers=3)


def test_pixel_bounds_are_refused():
    """Kimi_K25ImageProcessor has no min_pixels / max_pixels: navit_resize decides (the spec's grid)."""
    with pytest.raises(SpecError, match="Kimi_K25ImageProcessor has no such setting"):
        _job(448, 448, min_pixels=1000)

"""Muse Glimmer's parts as hpcmem counts them (hpcmem.models.muse_glimmer: its windowed NaViT tower, vision adapter
and projection at MuseGlimmerVisionConfig's defaults, the language model from the learned profile of its
muse_glimmer_text config, hpcmem.models.vlm_learned) against `AutoModelForImageTextToText.from_config` on the meta
device, on the cut of estimator/cases/vlm-muse-glimmer.yaml; peft's all-linear targets on that model; the patches
and image tokens of a picture as transformers' MuseGlimmerProcessor (around hpcmem.trace.vision_muse_glimmer's PIL
stand-in) makes them, and the stand-in's grid as transformers' own `smart_resize` computes it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate.vision import vision_adapters
from hpcmem.models.muse_glimmer import muse_glimmer_tower_from_config
from hpcmem.models.resolve import resolve_model
from hpcmem.validate.cases import case_job
from tests.helpers.meta_models import meta_image_text_model, peft_all_linear_targets
from tests.helpers.vlm_cuts import assert_processor_geometry, assert_refused_without_text_profile

CUT = Path(__file__).resolve().parents[1] / "fixtures" / "vlm" / "muse-glimmer-defaults-L2-D2.json"
SIZES = [(448, 448), (672, 896), (600, 1000), (1000, 600), (300, 200), (13, 9), (8000, 3000), (2000, 3000),
         (7200, 7300), (28, 2800), (5000, 14)]
MERGER = (".vision_adapter.", ".vision_projection.")


def _job(height: int, width: int, **extra):
    return case_job({"trainer": "sft", "model_name_or_path": str(CUT), "max_length": 4096, "images_per_example": 1,
                     "image_height": height, "image_width": width, "dtype": "bfloat16", "bf16": True, **extra})


def _vision_name(name: str) -> str | None:
    """A meta model module's name as hpcmem's TowerLinear names it: below `vision_tower.layers.N.` as
    `layers.N.<name>`, below `vision_tower.` (the patch embedder) and `model.` (the adapter, the projection) as it
    is; None elsewhere."""
    if ".vision_tower." in f".{name}":
        return name.split("vision_tower.", 1)[1]
    if any(m in f".{name}." for m in MERGER):
        return name.split("model.", 1)[1]
    return None


def _ours(linears, depth: int) -> dict[str, tuple[int, int]]:
    out = {}
    for x in linears:
        for i in range(x.count if x.part == "tower" else 1):
            out[f"layers.{i}.{x.name}" if x.part == "tower" else x.name] = (x.in_features, x.out_features)
    assert all(x.count == depth for x in linears if x.part == "tower")
    return out


def test_the_default_tower_by_hand():
    """MuseGlimmerVisionConfig's defaults: 50 layers of width 1536 (MLP 8960, 16 heads), patch_embedding Linear(2 ·
    3 · 14² = 1176 → 1536, no bias) and the 32 × 32 table; vision_adapter 4 · 1536 = 6144 → 4096 → 4096,
    vision_projection 4096 → 6656 (MuseGlimmerTextConfig.hidden_size); 448 × 448 px → 16 × 16 blocks of 28 px: 32 × 32
    patches, 256 tokens."""
    v = muse_glimmer_tower_from_config({"model_type": "muse_glimmer"}, "x")
    by_name = {x.name: x for x in v.linears()}
    assert (v.depth, v.hidden_size, v.position_side, v.num_heads) == (50, 1536, 32, 16)
    assert (by_name["patch_embedder.patch_embedding"].in_features, by_name["vision_adapter.fc1"].in_features,
            by_name["vision_adapter.fc2"].out_features, by_name["vision_projection"].out_features) == \
        (1176, 6144, 4096, 6656)
    assert v.grid(448, 448) == (32, 32) and v.image_tokens(448, 448) == 256
    # 4096 blocks at most: a 10,000 px square is 64 × 64 blocks, 128 × 128 patches
    assert v.grid(10_000, 10_000) == (128, 128)
    # the block parameters by hand: q/k/v/proj 4 · (1536² + 1536), fc1 1536 · 8960 + 8960, fc2 8960 · 1536 + 1536,
    # two LayerNorms 4 · 1536
    assert v.block_params == 4 * (1536 ** 2 + 1536) + 1536 * 8960 + 8960 + 8960 * 1536 + 1536 + 4 * 1536


@pytest.mark.torch
def test_parts_and_linears_equal_the_meta_model():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    model = meta_image_text_model(json.loads(CUT.read_text()))
    assert type(model).__name__ == "MuseGlimmerForConditionalGeneration"
    spec = resolve_model(str(CUT))
    count = {"tower": 0, "merger": 0, "language": 0}
    for name, p in model.named_parameters():
        part = "merger" if any(m in f".{name}" for m in MERGER) else "tower" if ".vision_tower." in f".{name}" \
            else "language"
        count[part] += p.numel()
    assert count == {"tower": spec.vision.tower_params, "merger": spec.vision.merger_params,
                     "language": spec.num_params}
    linears = {_vision_name(n): (m.in_features, m.out_features) for n, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and _vision_name(n)}
    assert linears == _ours(spec.vision.linears(), spec.vision.depth)
    assert spec.tie_word_embeddings is (model.get_output_embeddings().weight is model.get_input_embeddings().weight)
    assert spec.tie_word_embeddings is False
    assert spec.learned is not None


@pytest.mark.torch
def test_a_top_level_tie_flag_ties_the_head_and_a_text_one_does_not(tmp_path):
    """MuseGlimmerConfig declares no tie_word_embeddings: a config.json's top-level true ties lm_head to the token
    embeddings (PreTrainedModel reads the composite config's flag), text_config's does not."""
    pytest.importorskip("torch")
    from hpcmem.models.vision import text_part

    for where, tied in (("top", True), ("text", False)):
        cfg = json.loads(CUT.read_text())
        (cfg if where == "top" else cfg["text_config"])["tie_word_embeddings"] = True
        model = meta_image_text_model(cfg)
        assert (model.get_output_embeddings().weight is model.get_input_embeddings().weight) is tied
        assert text_part(cfg)["tie_word_embeddings"] is tied


@pytest.mark.torch
def test_peft_all_linear_reaches_what_the_spec_adapts():
    """peft's all-linear on the real model (peft/tuners/tuners_utils.py `_maybe_include_all_linear_layers`: every
    nn.Linear but the output embedding): its tower, adapter and projection targets are hpcmem's `vision_adapters`."""
    pytest.importorskip("torch")
    pytest.importorskip("peft")

    model = meta_image_text_model(json.loads(CUT.read_text()))
    targets = peft_all_linear_targets(model)
    job = _job(448, 448, use_peft=True, lora_target_modules="all-linear")
    theirs = {n for n in (_vision_name(t) for t in targets) if n}
    assert theirs == set(_ours(vision_adapters(job, job.model.vision), job.model.vision.depth))
    assert "lm_head" not in targets


def _smart_resize():
    """transformers' own `smart_resize`, read from image_processing_muse_glimmer.py (the module imports torchvision
    at the top, which this environment lacks; the function needs itertools and math alone)."""
    import ast
    import importlib.util
    import itertools
    import math

    spec = importlib.util.find_spec("transformers")
    if spec is None:
        pytest.skip("transformers not installed")
    path = Path(spec.origin).parent / "models" / "muse_glimmer" / "image_processing_muse_glimmer.py"
    tree = ast.parse(path.read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "smart_resize")
    scope = {"math": math, "itertools": itertools}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), str(path), "exec"), scope)  # noqa: S102
    return scope["smart_resize"]


@pytest.mark.parametrize(("height", "width"), SIZES)
def test_the_grid_is_smart_resize_s(height, width):
    """image_processing_muse_glimmer.py `smart_resize` at the class defaults (14 px patches, merge 2, 4096 tokens),
    as `MuseGlimmerImageProcessor.resize` calls it (patch_size · merge_size), over the patch: the spec's grid."""
    h, w = _smart_resize()(height, width, patch_size=28, max_tokens=4096)
    v = muse_glimmer_tower_from_config(json.loads(CUT.read_text()), "cut")
    assert v.grid(height, width) == (h // 14, w // 14)


@pytest.mark.torch
@pytest.mark.parametrize(("height", "width"), [(448, 448), (672, 896), (500, 333), (100, 120)])
def test_the_processor_counts_the_spec_s_image_tokens(height, width):
    """MuseGlimmerProcessor (hpcmem.trace.vision `processor`, transformers' own class around the PIL stand-in) on one
    image: its <|patch|> tokens, pixel_values [patches, 2 · 3 · 14²] and grid are the spec's, with <|image_start|>
    and <|image_end|> around them."""
    proc = assert_processor_geometry(CUT, height, width, "MuseGlimmerProcessor", patch_columns=True)
    from PIL import Image

    out = proc(text=[proc.image_token + " t3"], images=[[Image.new("RGB", (width, height))]], return_tensors="pt")
    ids = out["input_ids"][0].tolist()
    assert ids[0] == proc.image_start_token_id and ids[-2] == proc.image_end_token_id
    assert {(448, 448): 256, (672, 896): 768, (500, 333): 216, (100, 120): 20}[(height, width)] == \
        ids.count(proc.image_token_id)


def test_a_non_square_position_table_is_refused():
    cfg = json.loads(CUT.read_text())
    cfg["vision_config"]["pos_emb_width"] = 16
    with pytest.raises(SpecError, match="pos_emb_height"):
        muse_glimmer_tower_from_config(cfg, "cut")


def test_an_adapter_width_other_than_the_shuffled_rows_is_refused():
    cfg = {**json.loads(CUT.read_text()), "out_hidden_size": 4096}
    with pytest.raises(SpecError, match="out_hidden_size 4096"):
        muse_glimmer_tower_from_config(cfg, "cut")


def test_a_text_config_without_a_learned_profile_is_refused(tmp_path):
    assert_refused_without_text_profile(CUT, tmp_path, num_hidden_layers=3)


def test_pixel_bounds_are_refused():
    """MuseGlimmerImageProcessor has no min_pixels / max_pixels: smart_resize under max_image_tokens decides."""
    with pytest.raises(SpecError, match="MuseGlimmerImageProcessor has no such setting"):
        _job(448, 448, min_pixels=1000)

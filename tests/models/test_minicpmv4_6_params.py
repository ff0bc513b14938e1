"""MiniCPM-V 4.6's parts as hpcmem counts them (its SigLIP-style tower with the window-attention merger and the MLP
merger in hpcmem.models.minicpmv4_6, the language model from the learned profile of its Qwen3.5 text config,
hpcmem.models.vlm_learned) against `AutoModelForImageTextToText.from_config` on the meta device, on the cut of
estimator/cases/vlm-minicpmv4-6.yaml; peft's all-linear targets on that model; the slices and image tokens of a
picture as transformers' MiniCPMV4_6Processor and MiniCPMV4_6ImageProcessorPil make them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate.vision import vision_adapters
from hpcmem.job.images import image_geometry
from hpcmem.models.minicpmv4_6 import minicpmv4_6_tower_from_config
from hpcmem.models.resolve import resolve_model
from hpcmem.validate.cases import case_job
from tests.helpers.meta_models import meta_image_text_model, meta_part_counts, peft_all_linear_targets
from tests.helpers.vlm_cuts import assert_refused_without_text_profile

CUT = Path(__file__).resolve().parents[1] / "fixtures" / "vlm" / "minicpmv4-6-defaults-L2-D2.json"
SIZES = [(448, 448), (672, 896), (600, 1000), (1000, 600), (300, 200), (2000, 3000), (1344, 1344)]


def _job(height: int, width: int, **extra):
    return case_job({"trainer": "sft", "model_name_or_path": str(CUT), "max_length": 4096, "images_per_example": 1,
                     "image_height": height, "image_width": width, "dtype": "bfloat16", "bf16": True, **extra})


def _vision_name(name: str) -> str | None:
    """A meta model module's name as hpcmem's TowerLinear names it: below `vision_tower.encoder.layers.N.` as
    `blocks.N.<name>`, below `vision_tower.` (the window merger) or `model.merger.` as it is; None elsewhere."""
    for prefix in ("vision_tower.encoder.layers.", "vision_tower.", "model.merger."):
        if prefix in name:
            rest = name.split(prefix, 1)[1]
            return f"blocks.{rest}" if prefix.endswith("layers.") else rest
    return None


def test_the_mergers_by_hand():
    """modular_minicpmv4_6.py: the window merger's linear_1 (4 · 768 → 4 · 3072) and linear_2 (→ 768); the MLP
    merger's (MiniCPMV4_6DownsampleMLP) linear_1 (4 · 768 → 4 · 768) and linear_2 (→ the text width 4096); the head
    untied (MiniCPMV4_6Config.tie_word_embeddings False)."""
    spec = resolve_model(str(CUT))
    by_name = {x.name: (x.in_features, x.out_features) for x in spec.vision.linears()}
    assert by_name["vit_merger.linear_1"] == (3072, 12288) and by_name["vit_merger.linear_2"] == (12288, 768)
    assert by_name["mlp.0.linear_1"] == (3072, 3072) and by_name["mlp.0.linear_2"] == (3072, 4096)
    assert spec.tie_word_embeddings is False
    assert spec.vision.early_layers == 1


@pytest.mark.torch
def test_parts_and_linears_equal_the_meta_model():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    model = meta_image_text_model(json.loads(CUT.read_text()))
    assert type(model).__name__ == "MiniCPMV4_6ForConditionalGeneration"
    spec = resolve_model(str(CUT))
    count = meta_part_counts(model, tower=".vision_tower.", merger=".merger.")
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
    nn.Linear but the output embedding): its tower, window-merger and merger targets are hpcmem's `vision_adapters`."""
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


@pytest.mark.torch
@pytest.mark.parametrize(("height", "width"), SIZES)
def test_the_image_processor_cuts_the_spec_s_slices(height, width):
    """MiniCPMV4_6ImageProcessorPil (its class defaults, the tower's 16 px patches) on one image: its target_sizes are
    the spec's slices (the source, then the grid's)."""
    pytest.importorskip("transformers")
    from PIL import Image

    from hpcmem.trace.vision import processor

    job = _job(height, width)
    proc = processor(job)
    out = proc.image_processor(Image.new("RGB", (width, height)), return_tensors="pt")
    assert tuple(map(tuple, out["target_sizes"].tolist())) == job.model.vision.slices(height, width)


@pytest.mark.torch
@pytest.mark.parametrize(("height", "width"), [(448, 448), (672, 896)])
def test_the_processor_counts_the_spec_s_image_tokens(height, width):
    """MiniCPMV4_6Processor (hpcmem.trace.vision `processor`, transformers' own class) on one image: its image tokens,
    pixel columns and the tokens around them are the spec's and hpcmem.trace.vision_minicpmv4_6 `markers`'."""
    pytest.importorskip("transformers")
    from PIL import Image
    from transformers.models.minicpmv4_6.processing_minicpmv4_6 import MiniCPMV4_6Processor

    from hpcmem.trace.vision import processor
    from hpcmem.trace.vision_minicpmv4_6 import markers

    job = _job(height, width)
    proc = processor(job)
    assert isinstance(proc, MiniCPMV4_6Processor)
    out = proc(text=[proc.image_token + " t3"], images=[[Image.new("RGB", (width, height))]], return_tensors="pt")
    g = image_geometry(job.train, job.model.vision)
    ids = out["input_ids"][0]
    assert int((ids == proc.image_token_id).sum()) == g.tokens
    assert out["pixel_values"].shape[-1] == g.patches * job.model.vision.patch_size
    assert len(ids) == g.tokens + markers(job) + 1
    assert {(448, 448): 49, (672, 896): 240}[(height, width)] == g.tokens


def test_an_insert_layer_outside_the_tower_is_refused():
    """MiniCPMV4_6VisionModel.forward runs the window merger only after layer insert_layer_id (class default 6): a
    2-layer tower at the default never runs it and the merger's view fails; refused in one line."""
    cfg = json.loads(CUT.read_text())
    del cfg["insert_layer_id"]
    with pytest.raises(SpecError, match="insert_layer_id 6 must name one of the tower's 2 layers"):
        minicpmv4_6_tower_from_config(cfg, "cut")


def test_a_text_config_without_a_learned_profile_is_refused(tmp_path):
    assert_refused_without_text_profile(CUT, tmp_path, num_hidden_layers=3)


def test_pixel_bounds_are_refused():
    """MiniCPMV4_6ImageProcessor has no min_pixels / max_pixels: its own resize and slices decide (the spec's)."""
    with pytest.raises(SpecError, match="MiniCPMV4_6ImageProcessor has no such setting"):
        _job(448, 448, min_pixels=1000)

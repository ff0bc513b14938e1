"""Cosmos3 Edge's parts as hpcmem counts them (hpcmem.models.cosmos3_edge: its packed SigLIP2 tower and 2 × 2 patch
merger at Cosmos3EdgeVisionConfig's defaults, the language model from the learned profile of its cosmos3_edge_text
config, hpcmem.models.vlm_learned) against `AutoModelForImageTextToText.from_config` on the meta device, on the cut of
estimator/cases/vlm-cosmos3-edge.yaml; peft's all-linear targets on that model; the image tokens a picture takes
counted by transformers' Cosmos3EdgeProcessor (around Cosmos3EdgeImageProcessorPil, GLM-4.1V's smart_resize)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate.vision import vision_adapters
from hpcmem.models.cosmos3_edge import cosmos3_edge_tower_from_config
from hpcmem.models.resolve import resolve_model
from hpcmem.validate.cases import case_job
from tests.helpers.meta_models import meta_image_text_model, meta_part_counts, peft_all_linear_targets
from tests.helpers.vlm_cuts import assert_processor_geometry, assert_refused_without_text_profile

CUT = Path(__file__).resolve().parents[1] / "fixtures" / "vlm" / "cosmos3-edge-defaults-L2-D2.json"


def _job(height: int, width: int, **extra):
    return case_job({"trainer": "sft", "model_name_or_path": str(CUT), "max_length": 4096, "images_per_example": 1,
                     "image_height": height, "image_width": width, "dtype": "bfloat16", "bf16": True, **extra})


def _vision_name(name: str) -> str | None:
    """A meta model module's name as hpcmem's TowerLinear names it: below `visual.encoder.` (layers.N.<name>),
    `visual.embeddings.` (patch_embedding) or `projector.`."""
    for part in ("visual.encoder.", "visual.embeddings.", "projector."):
        if f".{part}" in f".{name}":
            return name.rsplit(part, 1)[-1]
    return None


def _ours(linears, depth: int) -> dict[str, tuple[int, int]]:
    out = {}
    for x in linears:
        if x.part != "tower":
            out[x.name] = (x.in_features, x.out_features)
            continue
        for i in range(depth):
            out[f"layers.{i}.{x.name}"] = (x.in_features, x.out_features)
    return out


def test_the_default_tower_by_hand():
    """Cosmos3EdgeVisionConfig's defaults: 27 layers of width 1152 (MLP 4304), patch_embedding Linear(3 · 16² = 768 →
    1152) and the 16 × 16 table (num_patches 256); the merger 4 · 1152 → 11520 → 2048 (Cosmos3EdgeConfig.
    projector_hidden_size, Cosmos3EdgeTextConfig.hidden_size); 448 × 448 px → 28 × 28 patches, 196 tokens."""
    v = cosmos3_edge_tower_from_config({"model_type": "cosmos3_edge"}, "x")
    by_name = {x.name: x for x in v.linears()}
    assert (v.depth, v.hidden_size, v.position_side) == (27, 1152, 16)
    assert (by_name["patch_embedding"].in_features, by_name["linear_fc1"].in_features,
            by_name["linear_fc1"].out_features, by_name["linear_fc2"].out_features) == (768, 4608, 11520, 2048)
    assert v.resized(448, 448, *v.default_pixels) == (448, 448)
    assert v.resized(100, 100, *v.default_pixels) == (256, 256)     # min_pixels 256²


def test_a_merge_size_it_does_not_model_is_refused():
    with pytest.raises(SpecError, match="spatial_merge_size"):
        cosmos3_edge_tower_from_config({"model_type": "cosmos3_edge", "vision_config": {"spatial_merge_size": 3}},
                                       "x")


@pytest.mark.torch
def test_parts_and_linears_equal_the_meta_model():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    model = meta_image_text_model(json.loads(CUT.read_text()))
    assert type(model).__name__ == "Cosmos3EdgeForConditionalGeneration"
    spec = resolve_model(str(CUT))
    count = meta_part_counts(model, tower=".visual.", merger=".projector.")
    assert count == {"tower": spec.vision.tower_params, "merger": spec.vision.merger_params,
                     "language": spec.num_params}
    linears = {_vision_name(n): (m.in_features, m.out_features) for n, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and _vision_name(n)}
    assert linears == _ours(spec.vision.linears(), spec.vision.depth)
    assert spec.tie_word_embeddings is (model.get_output_embeddings().weight is model.get_input_embeddings().weight)
    assert spec.learned is not None


@pytest.mark.torch
def test_peft_all_linear_reaches_what_the_spec_adapts():
    """peft's all-linear on the real model (peft/tuners/tuners_utils.py `_maybe_include_all_linear_layers`: every
    nn.Linear but the output embedding): its tower and merger targets are hpcmem's `vision_adapters`."""
    pytest.importorskip("torch")
    pytest.importorskip("peft")

    model = meta_image_text_model(json.loads(CUT.read_text()))
    targets = peft_all_linear_targets(model)
    job = _job(448, 448, use_peft=True, lora_target_modules="all-linear")
    theirs = {n for n in (_vision_name(t) for t in targets) if n}
    assert theirs == set(_ours(vision_adapters(job, job.model.vision), job.model.vision.depth))
    assert "lm_head" not in targets


@pytest.mark.torch
@pytest.mark.parametrize(("height", "width"), [(448, 448), (672, 896), (300, 500), (1000, 1000), (1500, 700),
                                               (100, 120)])
def test_the_processor_counts_the_spec_s_image_tokens(height, width):
    """Cosmos3EdgeProcessor (hpcmem.trace.vision `processor`, transformers' own class) on one image: its image_pad
    tokens, pixel_values rows and image_grid_thw are the spec's (GLM-4.1V's smart_resize to 32 px multiples at one
    frame, 16 px patches, 2 × 2 merged into one token)."""
    assert_processor_geometry(CUT, height, width, "Cosmos3EdgeProcessor", patch_columns=True)


def test_a_text_config_without_a_learned_profile_is_refused(tmp_path):
    assert_refused_without_text_profile(CUT, tmp_path, num_hidden_layers=3)

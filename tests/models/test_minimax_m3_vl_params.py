"""MiniMax M3 VL's parts as hpcmem counts them (hpcmem.models.minimax_m3_vl: its CLIP-layer tower and two-stage
merging projector at MiniMaxM3VLVisionConfig's defaults, the language model from the learned profile of its
minimax_m3_vl_text config, hpcmem.models.vlm_learned) against `AutoModelForImageTextToText.from_config` on the meta
device, on the cut of estimator/cases/vlm-minimax-m3-vl.yaml; peft's all-linear targets on that model; the image
tokens a picture takes counted by transformers' MiniMaxM3VLProcessor (around the PIL stand-in for its
torchvision-only image processor, hpcmem.trace.vision_minimax_m3_vl)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate.vision import vision_adapters
from hpcmem.models.minimax_m3_vl import minimax_m3_tower_from_config
from hpcmem.validate.cases import case_job
from tests.helpers.meta_models import assert_tower_and_projector_match, meta_image_text_model, peft_all_linear_targets
from tests.helpers.vlm_cuts import assert_processor_geometry, assert_refused_without_text_profile

CUT = Path(__file__).resolve().parents[1] / "fixtures" / "vlm" / "minimax-m3-vl-defaults-L2-D2.json"


def test_the_default_tower_by_hand():
    """MiniMaxM3VLVisionConfig's defaults: 32 layers of width 1280 (MLP 5120, 16 heads of 80), the Conv3d over
    3 · 2 · 14² = 1176 values a patch without bias; rotary over 3 · 2 · ((80 // 3) // 2) = 78 channels; the projector
    1280 → 6144 → 6144, then 4 · 6144 = 24576 → 6144 → 6144 (projector_hidden_size and the text width 6144)."""
    v = minimax_m3_tower_from_config({"model_type": "minimax_m3_vl"}, "x")
    by_name = {x.name: x for x in v.linears()}
    assert (v.depth, v.hidden_size, v.patch_dim, v.rotary_dim) == (32, 1280, 1176, 78)
    assert v.embed_params == 1176 * 1280
    assert (by_name["linear_1"].in_features, by_name["linear_1"].out_features, by_name["linear_2"].out_features,
            by_name["merge_linear_1"].in_features, by_name["merge_linear_2"].out_features) == (
        1280, 6144, 6144, 24576, 6144)
    assert v.default_pixels == (3136, 451584)


def test_a_tuple_patch_size_is_refused():
    with pytest.raises(SpecError, match="patch_size"):
        minimax_m3_tower_from_config({"model_type": "minimax_m3_vl", "vision_config": {"patch_size": [14, 14]}}, "x")


@pytest.mark.torch
def test_parts_and_linears_equal_the_meta_model():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    model, spec = assert_tower_and_projector_match(CUT, "MiniMaxM3SparseForConditionalGeneration", layers="layers")
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
    job = case_job({"trainer": "sft", "model_name_or_path": str(CUT), "max_length": 4096, "images_per_example": 1,
                    "image_height": 448, "image_width": 448, "dtype": "bfloat16", "bf16": True, "use_peft": True,
                    "lora_target_modules": "all-linear"})
    v = job.model.vision
    ours = {f"layers.{i}.{x.name}" if x.part == "tower" else x.name
            for x in vision_adapters(job, v) for i in range(v.depth if x.part == "tower" else 1)}
    theirs = {t.split(part, 1)[1] for t in targets for part in ("model.vision_tower.", "model.multi_modal_projector.")
              if t.startswith(part)}
    assert theirs == ours
    assert "lm_head" not in targets


@pytest.mark.torch
@pytest.mark.parametrize(("height", "width"), [(448, 448), (672, 560), (300, 500), (1000, 1000), (1500, 700),
                                               (40, 60)])
def test_the_processor_counts_the_spec_s_image_tokens(height, width):
    """MiniMaxM3VLProcessor (hpcmem.trace.vision `processor`, transformers' own class) on one image: its image
    tokens, pixel_values rows and image_grid_thw are the spec's (Qwen2-VL's smart_resize to 28 px multiples within
    3,136 … 451,584 pixels, two frames of 14 px patches a row, 2 × 2 merged into one token)."""
    assert_processor_geometry(CUT, height, width, "MiniMaxM3VLProcessor", patch_columns=True)


@pytest.mark.torch
def test_the_stand_in_image_processor_is_the_torchvision_class_s_arithmetic():
    """The PIL stand-in and MiniMaxM3VLImageProcessor share Qwen2VLImageProcessor's geometry: the class's own
    `size`, patch, temporal patch and merge sizes are what the spec and the trace use (read off the class, which
    imports without torchvision only as far as its attributes)."""
    src = Path(__import__("transformers").__file__).parent / "models" / "minimax_m3_vl" / \
        "image_processing_minimax_m3_vl.py"
    text = src.read_text()
    assert 'size = {"shortest_edge": 4 * 28 * 28, "longest_edge": 451584}' in text
    assert "patch_size = 14" in text and "temporal_patch_size = 2" in text and "merge_size = 2" in text


def test_a_text_config_without_a_learned_profile_is_refused(tmp_path):
    assert_refused_without_text_profile(CUT, tmp_path, num_hidden_layers=3)

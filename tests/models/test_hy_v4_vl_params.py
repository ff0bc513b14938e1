"""HY-V4-VL's parts as hpcmem counts them (hpcmem.models.hy_v4_vl: HunYuanVL's tower at HYV4VLVisionConfig's widths
under its convolution merger, the language model from the learned profile of its hy_v4_vl_text config,
hpcmem.models.vlm_learned) against `AutoModelForImageTextToText.from_config` on the meta device, on the cut of
estimator/cases/vlm-hy-v4-vl.yaml; peft's all-linear targets on that model; the image tokens a picture takes counted
by transformers' HYV4VLProcessor (around HYV4VLImageProcessorPil, HunYuanVL's)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate.vision import vision_adapters
from hpcmem.models.hy_v4_vl import hy_v4_vl_tower_from_config
from hpcmem.models.resolve import resolve_model
from hpcmem.validate.cases import case_job
from tests.helpers.meta_models import meta_image_text_model, meta_part_counts, peft_all_linear_targets
from tests.helpers.vlm_cuts import assert_processor_geometry, assert_refused_without_text_profile
from tests.models.test_hunyuan_vl_params import _ours, _vision_name

CUT = Path(__file__).resolve().parents[1] / "fixtures" / "vlm" / "hy-v4-vl-defaults-L2-D2.json"


def test_the_default_tower_by_hand():
    """HYV4VLVisionConfig's defaults: 40 layers of width 1536 (MLP 6144), the 128-a-side position grid; the merger
    proj_conv 1536 → 6144 (2 × 2), proj_out 6144 → 6144 (out_hidden_size) and a 6144 newline vector, no Linear;
    512 × 512 px → 32 × 32 patches, 16 · 17 = 272 tokens (no begin or end)."""
    v = hy_v4_vl_tower_from_config({"model_type": "hy_v4_vl"}, "x")
    assert (v.depth, v.hidden_size, v.intermediate_size, v.position_side, v.out_hidden_size) == \
        (40, 1536, 6144, 128, 6144)
    assert not [x for x in v.linears() if x.part != "tower"]
    assert v.merger_params == 1536 + (6144 * 1536 * 4 + 6144) + (6144 * 6144 + 6144) + 6144
    assert v.image_tokens(32, 32) == 272 and v.image_tokens(56, 42) == 616


def test_what_it_does_not_model_is_refused():
    with pytest.raises(SpecError, match="spatial_merge_size"):
        hy_v4_vl_tower_from_config({"model_type": "hy_v4_vl", "vision_config": {"spatial_merge_size": 3}}, "x")
    with pytest.raises(SpecError, match="interpolate_mode 'nearest'"):
        hy_v4_vl_tower_from_config({"model_type": "hy_v4_vl", "vision_config": {"interpolate_mode": "nearest"}}, "x")


@pytest.mark.torch
def test_parts_and_linears_equal_the_meta_model():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    model = meta_image_text_model(json.loads(CUT.read_text()))
    assert type(model).__name__ == "HYV4VLForConditionalGeneration"
    spec = resolve_model(str(CUT))
    count = meta_part_counts(model, tower=".vision_tower.", merger=".patch_merger.")
    assert count == {"tower": spec.vision.tower_params, "merger": spec.vision.merger_params,
                     "language": spec.num_params}
    linears = {_vision_name(n): (m.in_features, m.out_features) for n, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and _vision_name(n)}
    assert linears == _ours(spec.vision.linears(), spec.vision.depth)
    assert spec.tie_word_embeddings is (model.get_output_embeddings().weight is model.get_input_embeddings().weight)
    assert spec.tie_word_embeddings is False
    assert spec.learned is not None


@pytest.mark.torch
def test_peft_all_linear_reaches_what_the_spec_adapts():
    pytest.importorskip("torch")
    pytest.importorskip("peft")

    model = meta_image_text_model(json.loads(CUT.read_text()))
    targets = peft_all_linear_targets(model)
    job = case_job({"trainer": "sft", "model_name_or_path": str(CUT), "max_length": 4096, "images_per_example": 1,
                    "image_height": 512, "image_width": 512, "dtype": "bfloat16", "bf16": True, "use_peft": True,
                    "lora_target_modules": "all-linear"})
    theirs = {n for n in (_vision_name(t) for t in targets) if n}
    assert theirs == set(_ours(vision_adapters(job, job.model.vision), job.model.vision.depth))


@pytest.mark.torch
@pytest.mark.parametrize(("height", "width"), [(512, 512), (672, 896), (300, 500), (1000, 1000), (1500, 700),
                                               (100, 120), (3000, 2000)])
def test_the_processor_counts_the_spec_s_image_tokens(height, width):
    """HYV4VLProcessor (hpcmem.trace.vision `processor`, transformers' own class) on one image: its image_pad tokens,
    [patches, 3 · 16²] pixel rows and image_grid_thw are the spec's (HunYuanVL's smart_resize, patch_h · (patch_w + 1)
    tokens)."""
    assert_processor_geometry(CUT, height, width, "HYV4VLProcessor", patch_columns=True)


def test_a_text_config_without_a_learned_profile_is_refused(tmp_path):
    assert_refused_without_text_profile(CUT, tmp_path, num_hidden_layers=3)

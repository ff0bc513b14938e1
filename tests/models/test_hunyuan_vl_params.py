"""HunYuanVL's parts as hpcmem counts them (hpcmem.models.hunyuan_vl: its tower and convolution patch merger at
HunYuanVLVisionConfig's defaults, the language model from the learned profile of its hunyuan_vl_text config,
hpcmem.models.vlm_learned) against `AutoModelForImageTextToText.from_config` on the meta device, on the cut of
estimator/cases/vlm-hunyuan-vl.yaml; peft's all-linear targets on that model; the image tokens a picture takes counted
by transformers' HunYuanVLProcessor (around HunYuanVLImageProcessorPil, Qwen2-VL's smart_resize)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate.vision import vision_adapters
from hpcmem.models.hunyuan_vl import hunyuan_vl_tower_from_config
from hpcmem.models.resolve import resolve_model
from hpcmem.validate.cases import case_job
from tests.helpers.meta_models import meta_image_text_model, meta_part_counts, peft_all_linear_targets
from tests.helpers.vlm_cuts import assert_refused_without_text_profile

CUT = Path(__file__).resolve().parents[1] / "fixtures" / "vlm" / "hunyuan-vl-defaults-L2-D2.json"


def _job(height: int, width: int, **extra):
    return case_job({"trainer": "sft", "model_name_or_path": str(CUT), "max_length": 8192, "images_per_example": 1,
                     "image_height": height, "image_width": width, "dtype": "bfloat16", "bf16": True, **extra})


def _vision_name(name: str) -> str | None:
    """A meta model module's name as hpcmem's TowerLinear names it: below `vision_tower.` (layers.N.<name>) or
    `vision_tower.patch_merger.`."""
    for part in ("vision_tower.patch_merger.", "vision_tower."):
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
    """HunYuanVLVisionConfig's defaults: 27 layers of width 1152 (MLP 4304); the position grid 2048 / 16 = 128 a side
    (128² + 1 rows); the merger's Linear 4 · 1152 = 4608 → 4096 (HunYuanVLTextConfig.hidden_size); 512 × 512 px →
    32 × 32 patches, 16 · 17 + 2 = 274 tokens; 100 × 100 px scaled up to 512 × 512 (min_pixels 512²)."""
    v = hunyuan_vl_tower_from_config({"model_type": "hunyuan_vl"}, "x")
    by_name = {x.name: x for x in v.linears()}
    assert (v.depth, v.hidden_size, v.position_side, v.hidden_act) == (27, 1152, 128, "gelu")
    assert (by_name["mlp"].in_features, by_name["mlp"].out_features) == (4608, 4096)
    assert v.embed_params == 3 * 16 * 16 * 1152 + 1152 + (128 * 128 + 1) * 1152
    assert v.image_tokens(32, 32) == 274 and v.image_tokens(56, 42) == 618
    job = case_job({"trainer": "sft", "model_name_or_path": str(CUT), "max_length": 8192, "images_per_example": 1,
                    "image_height": 100, "image_width": 100, "dtype": "bfloat16", "bf16": True})
    from hpcmem.job.images import image_geometry
    assert image_geometry(job.train, job.model.vision).resized == (512, 512)


def test_what_it_does_not_model_is_refused():
    with pytest.raises(SpecError, match="spatial_merge_size"):
        hunyuan_vl_tower_from_config({"model_type": "hunyuan_vl", "vision_config": {"spatial_merge_size": 3}}, "x")
    with pytest.raises(SpecError, match="interpolate_mode 'bicubic'"):
        hunyuan_vl_tower_from_config({"model_type": "hunyuan_vl", "vision_config": {"interpolate_mode": "bicubic"}},
                                     "x")
    with pytest.raises(SpecError, match="max_image_size 2050"):
        hunyuan_vl_tower_from_config({"model_type": "hunyuan_vl", "vision_config": {"max_image_size": 2050}}, "x")


@pytest.mark.torch
def test_parts_and_linears_equal_the_meta_model():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    model = meta_image_text_model(json.loads(CUT.read_text()))
    assert type(model).__name__ == "HunYuanVLForConditionalGeneration"
    spec = resolve_model(str(CUT))
    count = meta_part_counts(model, tower=".vision_tower.", merger=".patch_merger.")
    assert count == {"tower": spec.vision.tower_params, "merger": spec.vision.merger_params,
                     "language": spec.num_params}
    linears = {_vision_name(n): (m.in_features, m.out_features) for n, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and _vision_name(n)}
    assert linears == _ours(spec.vision.linears(), spec.vision.depth)
    assert spec.tie_word_embeddings is (model.get_output_embeddings().weight is model.get_input_embeddings().weight)
    assert spec.tie_word_embeddings is True
    assert spec.learned is not None


@pytest.mark.torch
def test_peft_all_linear_reaches_what_the_spec_adapts():
    """peft's all-linear on the real model (peft/tuners/tuners_utils.py `_maybe_include_all_linear_layers`: every
    nn.Linear but the output embedding; the Conv2d patch embedding and merger convolutions are none): its tower and
    merger targets are hpcmem's `vision_adapters`."""
    pytest.importorskip("torch")
    pytest.importorskip("peft")

    model = meta_image_text_model(json.loads(CUT.read_text()))
    targets = peft_all_linear_targets(model)
    job = _job(512, 512, use_peft=True, lora_target_modules="all-linear")
    theirs = {n for n in (_vision_name(t) for t in targets) if n}
    assert theirs == set(_ours(vision_adapters(job, job.model.vision), job.model.vision.depth))
    assert "lm_head" not in targets


@pytest.mark.torch
@pytest.mark.parametrize(("height", "width"), [(512, 512), (672, 896), (300, 500), (1000, 1000), (1500, 700),
                                               (100, 120), (3000, 2000)])
def test_the_processor_counts_the_spec_s_image_tokens(height, width):
    """HunYuanVLProcessor (hpcmem.trace.vision `processor`, transformers' own class) on one image written start,
    image, end as its `validate_inputs` asks: its image tokens, pixel_values rows [patches, 3 · 16²] and
    image_grid_thw are the spec's (Qwen2-VL's smart_resize to 32 px multiples in 512² … 2048² pixels, 16 px patches,
    patch_h · (patch_w + 1) + 2 tokens)."""
    pytest.importorskip("transformers")
    from PIL import Image

    from hpcmem.job.images import image_geometry
    from hpcmem.trace.vision import processor
    from hpcmem.trace.vision_hunyuan_vl import IMAGE, IMAGE_END, IMAGE_START

    job = _job(height, width)
    proc = processor(job)
    assert type(proc).__name__ == "HunYuanVLProcessor"
    out = proc(text=[IMAGE_START + IMAGE + IMAGE_END + " t3"], images=[[Image.new("RGB", (width, height))]],
               return_tensors="pt")
    g = image_geometry(job.train, job.model.vision)
    assert tuple(out["image_grid_thw"][0].tolist()) == g.grid_thw
    assert tuple(out["pixel_values"].shape) == (g.patches, job.model.vision.patch_dim)
    assert int((out["input_ids"][0] == proc.image_token_id).sum()) == g.tokens
    assert int(out["mm_token_type_ids"][0].sum()) == g.tokens


def test_a_text_config_without_a_learned_profile_is_refused(tmp_path):
    assert_refused_without_text_profile(CUT, tmp_path, num_hidden_layers=3)

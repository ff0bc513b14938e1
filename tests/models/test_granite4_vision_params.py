"""Granite 4 Vision's parts as hpcmem counts them (hpcmem.models.granite4_vision: the SigLIP tower, eight Window
Q-Former projectors and image_newline; the language model from the learned profile of its Granite text config,
hpcmem.models.vlm_learned) against `AutoModelForImageTextToText.from_config` on the meta device, on the cut of
estimator/cases/vlm-granite4-vision.yaml; peft's all-linear targets on that model; the tiles and image tokens an
image takes counted by transformers' Granite4VisionProcessor around LlavaNextImageProcessorPil."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate.vision import vision_adapters
from hpcmem.models.granite4_vision import granite4_vision_tower_from_config
from hpcmem.models.resolve import resolve_model
from hpcmem.validate.cases import case_job
from tests.helpers.meta_models import meta_image_text_model, peft_all_linear_targets
from tests.helpers.vlm_cuts import assert_refused_without_text_profile, processed_one_image

CUT = Path(__file__).resolve().parents[1] / "fixtures" / "vlm" / "granite4-vision-released-L8-D4.json"
PROJECTORS = ("layerwise_projectors", "spatial_projectors")


def _job(height: int, width: int, **extra):
    return case_job({"trainer": "sft", "model_name_or_path": str(CUT), "max_length": 4096, "images_per_example": 1,
                     "image_height": height, "image_width": width, "dtype": "bfloat16", "bf16": True, **extra})


def _part(name: str) -> str:
    if ".vision_tower." in name:
        return "tower"
    if any(f".{p}." in name for p in PROJECTORS):
        return "merger"
    return "newline" if name.endswith("image_newline") else "language"


def _vision_name(name: str) -> str | None:
    """A meta model module's name as hpcmem's TowerLinear names it: below `vision_tower.encoder.` (layers.N.<name>)
    or `<projectors>.K.` (the Q-Former layer's index as N)."""
    if ".vision_tower.encoder." in f".{name}":
        return name.rsplit("vision_tower.encoder.", 1)[-1]
    for p in PROJECTORS:
        if f".{p}." in f".{name}":
            rest = name.rsplit(f"{p}.", 1)[-1].split(".", 1)[-1]
            return rest.replace("encoder.layer.0.", "encoder.layer.N.")
    return None


def _ours(linears, depth: int) -> set[str]:
    return {x.name if x.part != "tower" else f"layers.{i}.{x.name}" for x in linears
            for i in (range(depth) if x.part == "tower" else (0,))}


def test_the_cut_by_hand():
    """The cut: SigLIP width 1152 (MLP 4304, 16 heads), 384 px tiles of 16 px patches (24 × 24 = 576 rows a tile);
    downsample_rate 4/8: 3 × 3 windows of 8 × 8 keys, 4 × 4 queries each → 12 × 12 = 144 image-token rows a tile;
    the Q-Former 1152 wide (18 heads of 64), MLP 3072. One projector by hand: norm 2·1152, query 16·1152, positions
    64·1152, the Q-Former's layernorm 2·1152, self- and cross-attention 4·(1152² + 1152) + 2·1152 each, the query MLP
    1152·3072 + 3072 + 3072·1152 + 1152 + 2·1152, out_linear 1152·4096 + 4096 = 22,534,528 (the meta model's too)."""
    v = resolve_model(str(CUT)).vision
    assert (v.patches, v.windows, v.token_side, v.tokens_per_tile, v.projectors) == (576, 9, 12, 144, 8)
    attn = 4 * (1152 ** 2 + 1152) + 2 * 1152
    mlp = 1152 * 3072 + 3072 + 3072 * 1152 + 1152 + 2 * 1152
    by_hand = 2 * 1152 + 16 * 1152 + 64 * 1152 + 2 * 1152 + 2 * attn + mlp + 1152 * 4096 + 4096
    assert v.projector_params == by_hand == 22_534_528
    # 384 × 384: the 384 × 384 pinpoint, 1 tile + the base; 12 × 12 unpadded + 12 newlines + 144 base = 300
    assert (v.anyres_tiles(384, 384), v.anyres_tokens(384, 384)) == (2, 144 + 12 + 144)
    # 672 × 896 (h × w): the 768 × 1152 pinpoint (scale 8/7 keeps all 602,112 px), 2 × 3 tiles + the base; token
    # grid 24 × 36, the image 896/672 = 1.33 wide against 1.5: its columns round(896 · 24 / 672) = 32, so
    # (36 − 32) // 2 = 2 padding columns off each side; 24·32 unpadded + 24 newlines + 144 base = 936
    assert (v.anyres_tiles(672, 896), v.anyres_tokens(672, 896)) == (7, 24 * 32 + 24 + 144)


@pytest.mark.parametrize(("change", "match"), [
    ({"downsample_rate": None}, "downsample_rate None"),
    ({"deepstack_layer_map": None}, "deepstack_layer_map None"),
    ({"vision_feature_select_strategy": "default"}, "vision_feature_select_strategy 'default'"),
    ({"vision_config": {"model_type": "clip_vision_model"}}, "clip_vision_model"),
    ({"spatial_target_layers": [4, 5, 6, 9]}, r"spatial_target_layers \[3, 2, 1, 0, 4, 5, 6, 9\]"),
    ({"downsample_rate": "3/8"}, "downsample_rate 3/8"),
])
def test_what_it_does_not_model_is_refused(change, match):
    cfg = {**json.loads(CUT.read_text()), **change}
    with pytest.raises(SpecError, match=match):
        granite4_vision_tower_from_config(cfg, "m")


@pytest.mark.torch
def test_parts_and_linears_equal_the_meta_model():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    model = meta_image_text_model(json.loads(CUT.read_text()))
    assert type(model).__name__ == "Granite4VisionForConditionalGeneration"
    spec = resolve_model(str(CUT))
    count = {"tower": 0, "merger": 0, "newline": 0, "language": 0}
    for name, p in model.named_parameters():
        count[_part(name)] += p.numel()
    v = spec.vision
    assert count == {"tower": v.tower_params, "merger": v.merger_params, "newline": 4096,
                     "language": spec.num_params}
    assert v.num_params == v.tower_params + v.merger_params + 4096
    linears = {_vision_name(n): (m.in_features, m.out_features) for n, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and _vision_name(n)}
    ours = {}
    for x in v.linears():
        for i in range(v.depth) if x.part == "tower" else (0,):
            ours[x.name if x.part != "tower" else f"layers.{i}.{x.name}"] = (x.in_features, x.out_features)
    assert linears == ours
    n_linear = sum(1 for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)
                   and any(f".{p}." in n for p in PROJECTORS))
    assert n_linear == sum(x.count for x in v.linears() if x.part == "merger")
    assert spec.tie_word_embeddings is (model.get_output_embeddings().weight is model.get_input_embeddings().weight)
    assert spec.learned is not None


@pytest.mark.torch
def test_peft_all_linear_reaches_what_the_spec_adapts():
    """peft's all-linear on the real model (peft/tuners/tuners_utils.py `_maybe_include_all_linear_layers`: every
    nn.Linear but the output embedding): its tower and projector targets are hpcmem's `vision_adapters`."""
    pytest.importorskip("torch")
    pytest.importorskip("peft")

    torch = pytest.importorskip("torch")
    model = meta_image_text_model(json.loads(CUT.read_text()))
    targets = peft_all_linear_targets(model)
    job = _job(384, 384, use_peft=True, lora_target_modules="all-linear")
    reached = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and _vision_name(n)
               and n in targets]
    adapted = vision_adapters(job, job.model.vision)
    assert len(reached) == sum(x.count for x in adapted)
    assert {_vision_name(n) for n in reached} == _ours(adapted, job.model.vision.depth)
    assert "lm_head" not in targets


@pytest.mark.torch
@pytest.mark.parametrize(("height", "width"), [(384, 384), (672, 896), (480, 640), (300, 1000), (1000, 300),
                                               (800, 800)])
def test_the_processor_counts_the_spec_s_tiles_and_image_tokens(height, width):
    """Granite4VisionProcessor (hpcmem.trace.vision `processor`, transformers' own class around
    LlavaNextImageProcessorPil) on one image: its tiles (pixel_values [1, tiles, 3, 384, 384]) and "<image>" tokens
    are the spec's."""
    job = _job(height, width)
    out, ids, g, proc = processed_one_image(job, height, width)
    assert type(proc).__name__ == "Granite4VisionProcessor"
    assert tuple(out["pixel_values"].shape) == (1, g.grid_thw[0], 3, 384, 384)
    assert g.patches == g.grid_thw[0] * 576
    assert int((ids == proc.image_token_id).sum()) == g.tokens


def test_a_text_config_without_a_learned_profile_is_refused(tmp_path):
    assert_refused_without_text_profile(CUT, tmp_path, intermediate_size=5504)

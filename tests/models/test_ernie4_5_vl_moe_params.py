"""ERNIE-4.5-VL's parts as hpcmem counts them (hpcmem.models.ernie4_5_vl_moe: its tower and variable-resolution
resampler at Ernie4_5_VLMoeVisionConfig's defaults, the language model from the learned profile of its
ernie4_5_vl_moe_text config, hpcmem.models.vlm_learned) against `AutoModelForImageTextToText.from_config` on the meta
device, on the cut of estimator/cases/vlm-ernie4-5-vl-moe.yaml; peft's all-linear targets on that model; the image
tokens a picture takes counted by transformers' Ernie4_5_VLMoeProcessor (around Ernie4_5_VLMoeImageProcessorPil,
Qwen2-VL's smart_resize), and the tokens its moe_mm_token_type_ids send to the vision experts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate.vision import vision_adapters
from hpcmem.job.images import image_geometry
from hpcmem.models.ernie4_5_vl_moe import ernie45vl_tower_from_config
from hpcmem.models.resolve import resolve_model
from hpcmem.validate.cases import case_job
from tests.helpers.meta_models import meta_image_text_model, meta_part_counts, peft_all_linear_targets
from tests.helpers.vlm_cuts import assert_processor_geometry, assert_refused_without_text_profile

CUT = Path(__file__).resolve().parents[1] / "fixtures" / "vlm" / "ernie4-5-vl-moe-defaults-L2-D2.json"


def _job(height: int, width: int, **extra):
    return case_job({"trainer": "sft", "model_name_or_path": str(CUT), "max_length": 4096, "images_per_example": 1,
                     "image_height": height, "image_width": width, "dtype": "bfloat16", "bf16": True, **extra})


def _vision_name(name: str) -> str | None:
    """A meta model module's name as hpcmem's TowerLinear names it: below `vision_tower.` (blocks.N.<name>,
    patch_embed.proj) or `resampler_model.` (its `mlp` as resampler_model.mlp)."""
    for part in (".vision_tower.", ".resampler_model."):
        if part in f".{name}":
            rest = name.rsplit(part[1:], 1)[-1]
            return "resampler_model.mlp" if rest == "mlp" else rest
    return None


def _ours(linears, depth: int) -> dict[str, tuple[int, int]]:
    out = {}
    for x in linears:
        if x.part != "tower":
            out[x.name] = (x.in_features, x.out_features)
            continue
        for i in range(depth):
            out[f"blocks.{i}.{x.name}"] = (x.in_features, x.out_features)
    return out


def test_the_default_tower_by_hand():
    """Ernie4_5_VLMoeVisionConfig's defaults: 32 blocks of width 1280 (MLP 5120), patch_embed Linear(3 · 14² = 588 →
    1280, no bias); the resampler 4 · 1280 = 5120 wide, temporal_linear.fc1 reading 2 · 5120, mlp → 2560 (the text
    width); Ernie4_5_VLMoeTextConfig's routing: 27 sparse layers of 28, top 6, experts 1536 and 512 wide, 64 each."""
    v = ernie45vl_tower_from_config({"model_type": "ernie4_5_vl_moe"}, "x")
    by_name = {x.name: x for x in v.linears()}
    assert (v.depth, v.hidden_size, v.intermediate_size, v.num_heads) == (32, 1280, 5120, 16)
    assert (by_name["patch_embed.proj"].in_features, by_name["spatial_linear.fc1"].in_features,
            by_name["temporal_linear.fc1"].in_features, by_name["resampler_model.mlp"].out_features) == \
        (588, 5120, 10240, 2560)
    assert (v.sparse_layers, v.moe_k, v.text_expert_width, v.vision_expert_width, v.num_experts) == \
        (27, 6, 1536, 512, 64)


def test_the_image_geometry_by_hand():
    """Qwen2-VL's smart_resize at factor 28 with Ernie4_5_VLMoeImageProcessor's bounds (56², 28² · 6177): 896 × 672
    px stays (multiples of 28) → 64 × 48 patches of 14 px, 3,072 rows, 768 tokens; 100 × 120 px rounds to 112 × 112
    (above 56²) → 64 patches, 16 tokens."""
    g = image_geometry(_job(672, 896).train, _job(672, 896).model.vision)
    assert (g.resized, g.grid_thw, g.patches, g.tokens) == ((672, 896), (1, 48, 64), 3072, 768)
    small = _job(100, 120)
    assert image_geometry(small.train, small.model.vision).patches == 64


def test_merge_sizes_it_does_not_model_are_refused():
    for key in ("spatial_merge_size", "temporal_merge_size"):
        with pytest.raises(SpecError, match="temporal_merge_size 2"):
            ernie45vl_tower_from_config({"model_type": "ernie4_5_vl_moe", "vision_config": {key: 3}}, "x")
    with pytest.raises(SpecError, match="moe_intermediate_size"):
        ernie45vl_tower_from_config({"model_type": "ernie4_5_vl_moe", "text_config": {"moe_intermediate_size": 512}},
                                    "x")


@pytest.mark.torch
def test_parts_and_linears_equal_the_meta_model():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    model = meta_image_text_model(json.loads(CUT.read_text()))
    assert type(model).__name__ == "Ernie4_5_VLMoeForConditionalGeneration"
    spec = resolve_model(str(CUT))
    count = meta_part_counts(model, tower=".vision_tower.", merger=".resampler_model.")
    assert count == {"tower": spec.vision.tower_params, "merger": spec.vision.merger_params,
                     "language": spec.num_params}
    linears = {_vision_name(n): (m.in_features, m.out_features) for n, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and _vision_name(n)}
    assert linears == _ours(spec.vision.linears(), spec.vision.depth)
    assert spec.tie_word_embeddings is (model.get_output_embeddings().weight is model.get_input_embeddings().weight)
    assert spec.learned is not None
    # the routing terms' inputs: the sparse layers and the two expert sets' widths as the meta model built them
    blocks = [m.mlp for m in model.model.language_model.layers if hasattr(m.mlp, "vision_moe")]
    assert len(blocks) == spec.vision.sparse_layers
    assert {(b.text_moe.experts.intermediate_dim, b.vision_moe.experts.intermediate_dim, b.text_moe.top_k,
             b.vision_moe.num_experts) for b in blocks} == \
        {(spec.vision.text_expert_width, spec.vision.vision_expert_width, spec.vision.moe_k, spec.vision.num_experts)}


@pytest.mark.torch
def test_peft_all_linear_reaches_what_the_spec_adapts():
    """peft's all-linear on the real model (peft/tuners/tuners_utils.py `_maybe_include_all_linear_layers`: every
    nn.Linear but the output embedding): its tower and resampler targets are hpcmem's `vision_adapters`."""
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
    """Ernie4_5_VLMoeProcessor (hpcmem.trace.vision `processor`, transformers' own class) on one image: its image
    tokens, pixel_values rows ([patches, 3 · 14²]) and image_grid_thw are the spec's, and its moe_mm_token_type_ids
    mark those tokens and the image's two markers (what the routing terms count)."""
    from PIL import Image

    proc = assert_processor_geometry(CUT, height, width, "Ernie4_5_VLMoeProcessor", patch_columns=True)
    job = _job(height, width)
    tok = proc.tokenizer
    out = proc(text=[tok.image_start_token + tok.image_token + tok.image_end_token + " t3"],
               images=[[Image.new("RGB", (width, height))]], return_tensors="pt")
    g = image_geometry(job.train, job.model.vision)
    assert int(out["moe_mm_token_type_ids"].sum()) == g.tokens + 2


def test_a_text_config_without_a_learned_profile_is_refused(tmp_path):
    assert_refused_without_text_profile(CUT, tmp_path, num_hidden_layers=3)

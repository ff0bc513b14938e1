"""LFM3-VL's parts as hpcmem counts them (hpcmem.models.lfm3_vl: its conv/attention tower and LayerNorm/GELU projector
at Lfm3VlVisionConfig's defaults, the language model from the learned profile of its LFM3 text config,
hpcmem.models.vlm_learned) against `AutoModelForImageTextToText.from_config` on the meta device, on the cut of
estimator/cases/vlm-lfm3-vl.yaml; peft's all-linear targets on that model; the image tokens a picture takes counted by
transformers' Lfm3VlProcessor (Qwen3-VL's, around Qwen2-VL's image processor)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate.vision import vision_adapters
from hpcmem.models.lfm3_vl import default_layer_types, lfm3_vl_tower_from_config
from hpcmem.models.resolve import resolve_model
from hpcmem.validate.cases import case_job
from tests.helpers.meta_models import meta_image_text_model, meta_part_counts, peft_all_linear_targets
from tests.helpers.vlm_cuts import assert_processor_geometry, assert_refused_without_text_profile

CUT = Path(__file__).resolve().parents[1] / "fixtures" / "vlm" / "lfm3-vl-defaults-L2-D2.json"


def _job(height: int, width: int, **extra):
    return case_job({"trainer": "sft", "model_name_or_path": str(CUT), "max_length": 4096, "images_per_example": 1,
                     "image_height": height, "image_width": width, "dtype": "bfloat16", "bf16": True, **extra})


def _vision_name(name: str) -> str | None:
    """A meta model module's name as hpcmem's TowerLinear names it: below `vision_tower.` (layers.N.<name>, or the
    patch embedding's own name) or `multi_modal_projector.`."""
    for part in ("vision_tower.", "multi_modal_projector."):
        if f".{part}" in f".{name}":
            return name.rsplit(part, 1)[-1]
    return None


def _ours(linears) -> dict[str, tuple[int, int]]:
    """hpcmem's linears by the meta model's names: the layers' per layer of their kind, the rest by name."""
    spec = resolve_model(str(CUT))
    kinds = spec.vision.layer_types
    out = {}
    for x in linears:
        if x.part != "tower":
            out[x.name] = (x.in_features, x.out_features)
            continue
        wanted = "conv" if x.name.startswith("conv.") else "full_attention" if x.name.startswith("self_attn.") else None
        for i, kind in enumerate(kinds):
            if wanted in (None, kind):
                out[f"layers.{i}.{x.name}"] = (x.in_features, x.out_features)
    return out


def test_the_default_tower_by_hand():
    """Lfm3VlVisionConfig's defaults: 14 layers, conv at 0, 1 and every odd one (`__post_init__`), so 6 attention
    layers; q 16 · 64, k/v 8 · 64 (Lfm3VlVisionAttention, head_dim = 1024 / 16), in_proj 3 · 1024
    (Lfm3VlVisionShortConv), patch_embed Linear(3 · 2 · 16² = 1536 → 1024); the projector 4 · 1024 → 4096 → 2048
    (Lfm3VlConfig.projector_hidden_size, Lfm3Config.hidden_size)."""
    v = lfm3_vl_tower_from_config({"model_type": "lfm3_vl"}, "x")
    assert v.layer_types == default_layer_types(14)
    assert (v.attention_layers, v.conv_layers) == (6, 8)
    by_name = {x.name: x for x in v.linears()}
    assert (by_name["self_attn.q_proj"].out_features, by_name["self_attn.k_proj"].out_features) == (1024, 512)
    assert by_name["conv.in_proj"].out_features == 3 * 1024
    assert (by_name["patch_embed"].in_features, by_name["linear_1"].in_features,
            by_name["linear_2"].out_features) == (1536, 4096, 2048)


def test_a_layer_kind_it_does_not_model_is_refused():
    with pytest.raises(SpecError, match="layer_types"):
        lfm3_vl_tower_from_config({"model_type": "lfm3_vl", "vision_config": {
            "num_hidden_layers": 2, "layer_types": ["conv", "sliding_attention"]}}, "x")


@pytest.mark.torch
def test_parts_and_linears_equal_the_meta_model():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    model = meta_image_text_model(json.loads(CUT.read_text()))
    assert type(model).__name__ == "Lfm3VlForConditionalGeneration"
    spec = resolve_model(str(CUT))
    count = meta_part_counts(model, tower=".vision_tower.", merger=".multi_modal_projector.")
    assert count == {"tower": spec.vision.tower_params, "merger": spec.vision.merger_params,
                     "language": spec.num_params}
    linears = {_vision_name(n): (m.in_features, m.out_features) for n, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and _vision_name(n)}
    assert linears == _ours(spec.vision.linears())
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
    job = _job(448, 448, use_peft=True, lora_target_modules="all-linear")
    theirs = {n for n in (_vision_name(t) for t in targets) if n}
    assert theirs == set(_ours(vision_adapters(job, job.model.vision)))
    assert "lm_head" not in targets


@pytest.mark.torch
@pytest.mark.parametrize(("height", "width"), [(448, 448), (672, 896), (300, 500), (1000, 1000), (1500, 700)])
def test_the_processor_counts_the_spec_s_image_tokens(height, width):
    """Lfm3VlProcessor (hpcmem.trace.vision `processor`, transformers' own class) on one image: its image_pad tokens,
    pixel_values rows and image_grid_thw are the spec's (smart_resize to 32 px multiples, 16 px patches, 2 × 2 merged
    into one token)."""
    assert_processor_geometry(CUT, height, width, "Lfm3VlProcessor", patch_columns=True)


def test_a_text_config_without_a_learned_profile_is_refused(tmp_path):
    assert_refused_without_text_profile(CUT, tmp_path, num_hidden_layers=3)

"""EXAONE 4.5's parts as hpcmem counts them (Qwen2.5-VL's tower with grouped-query attention in hpcmem.models.vision,
the language model from the learned profile of its EXAONE 4 text config, hpcmem.models.vlm_learned) against
`AutoModelForImageTextToText.from_config` on the meta device, on the cut of estimator/cases/vlm-exaone4-5.yaml; the
image tokens a picture takes counted by transformers' Exaone4_5_Processor (Qwen2-VL's)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.models.resolve import resolve_model
from hpcmem.validate.cases import case_job
from tests.helpers.meta_models import meta_image_text_model, meta_part_counts
from tests.helpers.vlm_cuts import assert_processor_geometry, assert_refused_without_text_profile

CUT = Path(__file__).resolve().parents[1] / "fixtures" / "vlm" / "exaone4_5-defaults-L2-D2.json"


def _job(height: int, width: int):
    return case_job({"trainer": "sft", "model_name_or_path": str(CUT), "max_length": 4096, "images_per_example": 1,
                     "image_height": height, "image_width": width, "dtype": "bfloat16", "bf16": True})


def test_the_grouped_qkv_by_hand():
    """Exaone4_5_VisionAttention: qkv = Linear(3584, 16 · 224 + 2 · 8 · 224 = 7,168) with bias (Qwen2.5-VL's is
    3 · 3584 = 10,752)."""
    qkv = next(x for x in resolve_model(str(CUT)).vision.linears() if x.name == "attn.qkv")
    assert (qkv.in_features, qkv.out_features, qkv.count) == (3584, 7168, 2)


@pytest.mark.torch
def test_parts_and_linears_equal_the_meta_model():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    model = meta_image_text_model(json.loads(CUT.read_text()))
    assert type(model).__name__ == "Exaone4_5_ForConditionalGeneration"
    spec = resolve_model(str(CUT))
    assert meta_part_counts(model, tower=".visual.", merger=".visual.merger.") == {
        "tower": spec.vision.tower_params, "merger": spec.vision.merger_params, "language": spec.num_params}
    linears = {n.rsplit("visual.", 1)[-1]: (m.in_features, m.out_features) for n, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and ".visual." in f".{n}."}
    ours = {f"blocks.{i}.{x.name}": (x.in_features, x.out_features)
            for x in spec.vision.linears() if x.part == "tower" for i in range(x.count)}
    ours |= {f"merger.{x.name}": (x.in_features, x.out_features) for x in spec.vision.linears() if x.part == "merger"}
    assert linears == ours
    assert spec.tie_word_embeddings is (model.get_output_embeddings().weight is model.get_input_embeddings().weight)
    assert spec.learned is not None


@pytest.mark.torch
@pytest.mark.parametrize(("height", "width"), [(448, 448), (672, 896), (600, 1000)])
def test_the_processor_counts_the_spec_s_image_tokens(height, width):
    """Exaone4_5_Processor (hpcmem.trace.vision `processor`, transformers' own class) on one image: its image_pad
    tokens, pixel_values rows and image_grid_thw are the spec's (smart_resize to 28 px multiples, 14 px patches, 2 × 2
    merged into one token)."""
    assert_processor_geometry(CUT, height, width, "Exaone4_5_Processor", patch_columns=True)


def test_a_text_config_without_a_learned_profile_is_refused(tmp_path):
    assert_refused_without_text_profile(CUT, tmp_path, num_hidden_layers=3,
                                        layer_types=["sliding_attention", "sliding_attention", "full_attention"])

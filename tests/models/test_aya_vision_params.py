"""Aya Vision's parts as hpcmem counts them (hpcmem.models.aya_vision; the language model from the learned profile
of its text config, hpcmem.models.vlm_learned) against `AutoModelForImageTextToText.from_config` on the meta device:
AyaVisionConfig's SigLIP at 364 px cut to 2 layers, Cohere2Config's defaults cut to 2 layers; tiles, image tokens
and the projector by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcmem.job.images import image_geometry
from hpcmem.validate.cases import case_job
from tests.helpers.meta_models import assert_tower_and_projector_match
from tests.helpers.vlm_cuts import assert_refused_without_text_profile

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vlm"
CUT = FIXTURES / "aya-vision-L2-D2-364.json"


@pytest.mark.torch
def test_parts_and_linears_equal_the_meta_model():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    model, spec = assert_tower_and_projector_match(CUT, "AyaVisionForConditionalGeneration")
    assert spec.tie_word_embeddings is (model.get_output_embeddings().weight is model.get_input_embeddings().weight)


@pytest.mark.parametrize(("width", "tiles"), [(364, 1), (728, 3)])
def test_tiles_and_image_tokens_by_hand(width, tiles):
    """(364 / 14)² = 26² = 676 patches a tile, pixel_shuffle by 2: 13² = 169 image tokens a tile; a 364×728 image is
    GotOcr2's 2 × 1 canvas (aspect 2) and a thumbnail; the projector LayerNorm(4 · 1152), Linear(4608 → 8192),
    Linear(4096 → 8192) (alignment_intermediate_size: the text width, halved by the SwiGLU)."""
    job = case_job({"trainer": "sft", "model_name_or_path": str(CUT), "max_length": 1024, "images_per_example": 1,
                    "image_height": 364, "image_width": width, "dtype": "bfloat16", "bf16": True})
    g = image_geometry(job.train, job.model.vision)
    assert (g.grid_thw[0], g.patches, g.tokens) == (tiles, tiles * 676, tiles * 169)
    merger = {x.name: (x.in_features, x.out_features) for x in job.model.vision.linears() if x.part == "merger"}
    assert merger == {"linear_1": (4608, 8192), "linear_2": (4096, 8192)}
    assert job.model.vision.merger_params == 2 * 4608 + 4608 * 8192 + 8192 + 4096 * 8192 + 8192


def test_a_text_config_without_a_learned_profile_is_refused(tmp_path):
    assert_refused_without_text_profile(CUT, tmp_path, num_hidden_layers=3)

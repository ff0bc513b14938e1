"""Gemma 4's vision parts as hpcmem counts them (hpcmem.models.gemma4; the language model from the learned profile of
its text config, hpcmem.models.vlm_learned) against `AutoModelForImageTextToText.from_config` on the meta device:
Gemma4VisionConfig's encoder cut to 2 layers, Gemma4TextConfig's defaults cut to 2 layers (sliding, full) with a
32,768-token vocabulary; the resize against transformers' own `get_aspect_ratio_preserving_size`, the image tokens
and padded patch rows counted by Gemma4Processor; what is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.job.images import image_geometry
from hpcmem.models.gemma4 import gemma4_resized
from hpcmem.models.resolve import resolve_model
from hpcmem.validate.cases import case_job
from tests.helpers.meta_models import assert_tower_and_projector_match
from tests.helpers.vlm_cuts import processed_one_image

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vlm"
CUT = FIXTURES / "gemma4-L2-D2.json"
SIZES = (16, 100, 333, 480, 768, 1000, 1536, 2048, 4000)


def _job(height: int = 768, width: int = 768, **kw):
    return case_job({"trainer": "sft", "model_name_or_path": str(CUT), "max_length": 1024, "images_per_example": 1,
                     "image_height": height, "image_width": width, "dtype": "bfloat16", "bf16": True, **kw})


@pytest.mark.torch
def test_parts_and_linears_equal_the_meta_model():
    """vision_tower (patch embedder, 2 encoder layers) 35,199,232; embed_vision 1,769,472 (768 → 2304, no bias, a
    weightless RMSNorm); the language model the learned profile's; every nn.Linear of the tower and the embedder."""
    pytest.importorskip("transformers")
    model, spec = assert_tower_and_projector_match(CUT, "Gemma4ForConditionalGeneration", projector="embed_vision")
    assert (spec.vision.tower_params, spec.vision.merger_params) == (35_199_232, 1_769_472)
    assert spec.tie_word_embeddings is (model.get_output_embeddings().weight is model.get_input_embeddings().weight)


@pytest.mark.torch
def test_the_resize_is_transformers_own():
    pytest.importorskip("transformers")
    from transformers.models.gemma4.image_processing_pil_gemma4 import get_aspect_ratio_preserving_size

    for h in SIZES:
        for w in SIZES:
            for tokens in (70, 280, 1120):
                try:
                    real = get_aspect_ratio_preserving_size(h, w, 16, tokens * 9, 3)
                except ValueError:
                    with pytest.raises(SpecError):
                        gemma4_resized(h, w, 16, tokens * 9, 3)
                    continue
                assert gemma4_resized(h, w, 16, tokens * 9, 3) == real, (h, w, tokens)


@pytest.mark.torch
@pytest.mark.parametrize(("height", "width"), [(768, 768), (384, 1536), (1000, 300), (100, 2048)])
def test_the_processor_writes_the_spec_s_tokens(height, width):
    """Gemma4Processor (hpcmem.trace.vision_gemma4) on one image: its image tokens are the spec's, one boi and one
    eoi around them, and pixel_values one image padded to 280 · 9 = 2,520 patch rows of 3 · 16² values."""
    pytest.importorskip("transformers")
    from hpcmem.trace.vision_gemma4 import BOI, EOI

    job = _job(height, width)
    out, ids, g, proc = processed_one_image(job, height, width)
    assert int((ids == proc.image_token_id).sum()) == g.tokens
    assert [int((ids == t).sum()) for t in proc.tokenizer.convert_tokens_to_ids([BOI, EOI])] == [1, 1]
    assert tuple(out["pixel_values"].shape) == (1, g.patches, 768) == (1, 2520, 768)
    assert int((out["image_position_ids"][0] != -1).all(-1).sum()) == g.grid_thw[1] * g.grid_thw[2]


def test_the_geometry_by_hand():
    """768×768: √(2520 · 16² / 768²) = 1.046 → 803 px, down to 16 · 48 = 768: 48 × 48 patches, 256 soft tokens.
    384×1536: factor 1.0458 → 401 and 1606 px, down to 384 and 1584: 24 × 99 patches, 264 soft tokens."""
    assert image_geometry(_job().train, _job().model.vision).tokens == 256
    g = image_geometry(_job(384, 1536).train, _job(384, 1536).model.vision)
    assert (g.resized, g.grid_thw, g.patches, g.tokens) == ((384, 1584), (1, 24, 99), 2520, 264)


def _write(tmp_path, change):
    cfg = json.loads(CUT.read_text())
    change(cfg)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return str(tmp_path / "config.json")


def test_clipped_linears_are_refused(tmp_path):
    path = _write(tmp_path, lambda c: c["vision_config"].update(use_clipped_linears=True))
    with pytest.raises(SpecError, match="use_clipped_linears"):
        resolve_model(path)


def test_a_text_config_without_a_learned_profile_is_refused(tmp_path):
    layers = ["sliding_attention"] * 2 + ["full_attention"]
    path = _write(tmp_path, lambda c: c["text_config"].update(num_hidden_layers=3, layer_types=layers))
    with pytest.raises(SpecError, match="no learned profile of its text config"):
        resolve_model(path)


def test_bidirectional_text_attention_and_pixel_bounds_are_refused_with_images():
    """use_bidirectional_attention "vision" makes Gemma4Model build blockwise masks over the image tokens, which the
    text profile (traced on causal text) does not hold; the processor takes max_soft_tokens, not pixel bounds."""
    with pytest.raises(SpecError, match="min_pixels/max_pixels on gemma4"):
        _job(min_pixels=256 * 256)
    from dataclasses import replace
    from types import SimpleNamespace

    from hpcmem.job.image_rules import _gemma4_problems
    from hpcmem.models.gemma4 import gemma4_tower_from_config

    cfg = json.loads(CUT.read_text())
    cfg["text_config"]["use_bidirectional_attention"] = "vision"
    vision = gemma4_tower_from_config(cfg, "cut")
    assert vision.text_bidirectional == "vision" and replace(vision, text_bidirectional=None) == _job().model.vision
    job = SimpleNamespace(train=_job().train, model=SimpleNamespace(vision=vision))
    assert any("use_bidirectional_attention 'vision'" in p for p in _gemma4_problems(job))


def test_without_a_vision_config_there_is_no_tower(tmp_path):
    """Gemma4Config's vision_config is optional (SubConfigSpec optional=True): Gemma4Model builds no tower."""
    path = _write(tmp_path, lambda c: c.pop("vision_config"))
    assert resolve_model(path).vision is None

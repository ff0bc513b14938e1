"""Gemma 4 unified's vision embedder as hpcmem counts it (hpcmem.models.gemma4 `Gemma4UnifiedTowerSpec`; the language
model from the learned profile of its text config, hpcmem.models.vlm_learned) against
`AutoModelForImageTextToText.from_config` on the meta device: Gemma4UnifiedVisionConfig's defaults,
Gemma4UnifiedTextConfig's defaults cut to 2 layers (sliding, full) with a 32,768-token vocabulary; the image tokens,
merged rows and padding counted by Gemma4UnifiedProcessor around the PIL stand-in, whose merge is
image_processing_gemma4_unified.py's own `patches_merge`; what is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.job.images import image_geometry
from hpcmem.models.resolve import resolve_model
from hpcmem.validate.cases import case_job
from tests.helpers.meta_models import assert_tower_and_projector_match
from tests.helpers.vlm_cuts import assert_refused_without_text_profile, processed_one_image

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vlm"
CUT = FIXTURES / "gemma4-unified-L2.json"


def _job(height: int = 768, width: int = 768, **kw):
    return case_job({"trainer": "sft", "model_name_or_path": str(CUT), "max_length": 1024, "images_per_example": 1,
                     "image_height": height, "image_width": width, "dtype": "bfloat16", "bf16": True, **kw})


@pytest.mark.torch
def test_parts_and_linears_equal_the_meta_model():
    """embed_vision outside its multimodal_embedder 35,176,704 (patch_ln1 2 · 6,912, patch_dense 6,912 · 3,840 +
    3,840, patch_ln2 and pos_norm 2 · 2 · 3,840, pos_embedding 1,120 · 2 · 3,840); the multimodal_embedder 8,847,360
    (3,840 → 2,304, no bias, a weightless RMSNorm); the language model the learned profile's; both nn.Linears."""
    pytest.importorskip("transformers")
    model, spec = assert_tower_and_projector_match(CUT, "Gemma4UnifiedForConditionalGeneration",
                                                   tower="embed_vision", projector="embed_vision.multimodal_embedder")
    assert (spec.vision.tower_params, spec.vision.merger_params) == (35_176_704, 8_847_360)
    assert spec.vision.depth == 0 and not hasattr(model.model, "vision_tower")
    assert spec.tie_word_embeddings is (model.get_output_embeddings().weight is model.get_input_embeddings().weight)


@pytest.mark.torch
@pytest.mark.parametrize(("height", "width"), [(768, 768), (384, 1536), (1000, 300), (100, 2048)])
def test_the_processor_writes_the_spec_s_tokens(height, width):
    """Gemma4UnifiedProcessor (hpcmem.trace.vision_gemma4 `unified_processor`) on one image: its image tokens are the
    spec's, one boi and one eoi around them, pixel_values one image padded to 280 rows of (16 · 3)² · 3 = 6,912
    values, one unpadded row per image token."""
    pytest.importorskip("transformers")
    from hpcmem.trace.vision_gemma4 import BOI, EOI

    job = _job(height, width)
    out, ids, g, proc = processed_one_image(job, height, width)
    assert type(proc).__mro__[1].__name__ == "Gemma4UnifiedProcessor"
    assert int((ids == proc.image_token_id).sum()) == g.tokens
    assert [int((ids == t).sum()) for t in proc.tokenizer.convert_tokens_to_ids([BOI, EOI])] == [1, 1]
    assert tuple(out["pixel_values"].shape) == (1, g.patches, 6912) == (1, 280, 6912)
    assert int((out["image_position_ids"][0] != -1).all(-1).sum()) == g.tokens


@pytest.mark.torch
def test_the_merge_is_a_permutation_of_the_teacher_patches():
    """patches_merge (compiled from transformers' source) groups each 3 × 3 block of 16 px patches into one row of
    the 48 px patch: the merged rows hold every pixel once, and their positions are the 48 px grid's."""
    pytest.importorskip("transformers")
    import torch

    from hpcmem.trace.vision_gemma4 import source_function

    merge = source_function("image_processing_gemma4_unified", "patches_merge")
    h, w, p = 6, 9, 16
    teacher = torch.arange(h * w * p * p * 3, dtype=torch.float32).reshape(1, h * w, p * p * 3)
    gx, gy = torch.meshgrid(torch.arange(w), torch.arange(h), indexing="xy")
    pos = torch.stack([gx, gy], -1).reshape(1, h * w, 2)
    merged, merged_pos = merge(teacher, pos, h * w // 9)
    assert tuple(merged.shape) == (1, 6, 6912)
    assert torch.equal(merged.flatten().sort().values, teacher.flatten())
    assert sorted(map(tuple, merged_pos[0].tolist())) == [(x, y) for x in range(3) for y in range(2)]


def test_the_geometry_by_hand():
    """Gemma 4's resize at 280 · 9 patches: 768×768 → 48 × 48 patches, 256 rows; 384×1536 → 384 × 1584, 24 × 99
    patches, 264 rows; each image 280 rows of pixel_values."""
    g = image_geometry(_job().train, _job().model.vision)
    assert (g.patches, g.tokens) == (280, 256)
    g = image_geometry(_job(384, 1536).train, _job(384, 1536).model.vision)
    assert (g.resized, g.grid_thw, g.patches, g.tokens) == ((384, 1584), (1, 24, 99), 280, 264)


def _write(tmp_path, change):
    cfg = json.loads(CUT.read_text())
    change(cfg)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return str(tmp_path / "config.json")


def test_a_text_config_without_a_learned_profile_is_refused(tmp_path):
    assert_refused_without_text_profile(CUT, tmp_path, num_hidden_layers=3,
                                        layer_types=["sliding_attention"] * 2 + ["full_attention"])


def test_bidirectional_text_attention_and_pixel_bounds_are_refused_with_images(tmp_path):
    """Gemma4UnifiedTextConfig's default use_bidirectional_attention "vision" makes Gemma4UnifiedModel.forward build
    blockwise masks over the image tokens, which the text profile (traced on causal text) does not hold: a config
    that omits the key has it; the processor takes max_soft_tokens, not pixel bounds."""
    from types import SimpleNamespace

    from hpcmem.job.image_rules import _gemma4_problems
    from hpcmem.models.gemma4 import gemma4_unified_tower_from_config

    with pytest.raises(SpecError, match="min_pixels/max_pixels on gemma4_unified"):
        _job(min_pixels=256 * 256)
    cfg = json.loads(CUT.read_text())
    cfg["text_config"].pop("use_bidirectional_attention")
    vision = gemma4_unified_tower_from_config(cfg, "cut")
    assert vision.text_bidirectional == "vision"
    job = SimpleNamespace(train=_job().train, model=SimpleNamespace(vision=vision))
    assert any("use_bidirectional_attention 'vision' on gemma4_unified" in p for p in _gemma4_problems(job))


def test_mismatched_projection_width_is_refused(tmp_path):
    path = _write(tmp_path, lambda c: c["vision_config"].update(output_proj_dims=1024))
    with pytest.raises(SpecError, match="output_proj_dims"):
        resolve_model(path)


def test_without_a_vision_config_there_is_no_tower(tmp_path):
    path = _write(tmp_path, lambda c: c.pop("vision_config"))
    assert resolve_model(path).vision is None

"""Cohere2 Vision's parts as hpcmem counts them (hpcmem.models.cohere2_vision; the language model from the learned
profile of its text config, hpcmem.models.vlm_learned) against `AutoModelForImageTextToText.from_config` on the meta
device: Cohere2VisionConfig's SigLIP (512 px, 16 px patches) cut to 2 layers, Cohere2Config's defaults cut to 2
layers; the tiles against transformers' own `get_optimal_tiled_canvas` of image_processing_cohere2_vision.py, the
image tokens a tile counted by Cohere2VisionProcessor, the projector by hand."""

from __future__ import annotations

import ast
import json
from functools import lru_cache
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.job.images import image_geometry
from hpcmem.models.cohere2_vision import cohere2_canvas
from hpcmem.models.internvl import optimal_canvas
from hpcmem.models.resolve import resolve_model
from hpcmem.validate.cases import case_job
from tests.helpers.meta_models import assert_tower_and_projector_match
from tests.helpers.vlm_cuts import assert_refused_without_text_profile, processed_one_image

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vlm"
CUT = FIXTURES / "cohere2-vision-L2-D2-512.json"


def _job(width: int, height: int = 512):
    return case_job({"trainer": "sft", "model_name_or_path": str(CUT), "max_length": 4096, "images_per_example": 1,
                     "image_height": height, "image_width": width, "dtype": "bfloat16", "bf16": True})


@pytest.mark.torch
def test_parts_and_linears_equal_the_meta_model():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    model, spec = assert_tower_and_projector_match(CUT, "Cohere2VisionForConditionalGeneration")
    # the projector has no LayerNorm; post_layernorm is on the loss's path (last_hidden_state is read)
    assert not [n for n, m in model.named_modules() if ".multi_modal_projector" in n and isinstance(m, torch.nn.LayerNorm)]
    assert spec.vision.unused_params == 0
    assert spec.tie_word_embeddings is (model.get_output_embeddings().weight is model.get_input_embeddings().weight)


def test_projector_by_hand():
    """Linear(4 · 1152 → 36864) and Linear(18432 → 8192), both with bias, no LayerNorm: alignment_intermediate_size
    is Cohere2VisionConfig's 36864 (not the text width), halved by the SwiGLU."""
    v = _job(512).model.vision
    merger = {x.name: (x.in_features, x.out_features) for x in v.linears() if x.part == "merger"}
    assert merger == {"linear_1": (4608, 36864), "linear_2": (18432, 8192)}
    assert v.merger_params == 4608 * 36864 + 36864 + 18432 * 8192 + 8192


@lru_cache(maxsize=1)
def _transformers_canvas():
    """transformers' own get_optimal_tiled_canvas (and the get_all_supported_aspect_ratios it calls), read out of
    image_processing_cohere2_vision.py: the module imports torchvision, which this environment lacks, so the two
    numpy functions are compiled from its source alone."""
    transformers = pytest.importorskip("transformers")
    import numpy as np

    path = Path(transformers.__file__).parent / "models" / "cohere2_vision" / "image_processing_cohere2_vision.py"
    tree = ast.parse(path.read_text())
    wanted = [n for n in tree.body if isinstance(n, ast.FunctionDef)
              and n.name in ("get_all_supported_aspect_ratios", "get_optimal_tiled_canvas")]
    assert len(wanted) == 2
    space = {"np": np, "lru_cache": lru_cache}
    exec(compile(ast.Module(body=wanted, type_ignores=[]), str(path), "exec"), space)
    return space["get_optimal_tiled_canvas"]


@pytest.mark.torch
def test_the_canvas_is_transformers_own():
    real = _transformers_canvas()
    sizes = (100, 300, 512, 600, 777, 1000, 1024, 1536, 2048, 3000, 5000)
    for h in sizes:
        for w in sizes:
            for most in (1, 4, 6, 12):
                assert cohere2_canvas(h, w, 512, most) == tuple(real((h, w), (512, 512), 1, most)), (h, w, most)


@pytest.mark.parametrize(("height", "width", "tiles"), [(512, 512, 1), (512, 1024, 3), (600, 1000, 5)])
def test_tiles_and_image_tokens_by_hand(height, width, tiles):
    """(512 / 16)² = 1024 patches a tile, pixel_shuffle by 2: 256 image tokens a tile. 512×1024 is the 2 × 1 canvas
    (scale 1, no upscaling) and a thumbnail; 600×1000 the 2 × 2 canvas (the least scale ≥ 1: 1.024) and a thumbnail,
    where GotOcr2's closest aspect ratio would take 3 × 2."""
    g = image_geometry(_job(width, height).train, _job(width, height).model.vision)
    assert (g.grid_thw[0], g.patches, g.tokens) == (tiles, tiles * 1024, tiles * 256)
    if (height, width) == (600, 1000):
        assert optimal_canvas(600, 1000, 512, 1, 12) == (3, 2)


@pytest.mark.torch
@pytest.mark.parametrize(("height", "width"), [(512, 512), (512, 1024), (600, 1000), (1000, 300)])
def test_the_processor_writes_the_spec_s_tokens(height, width):
    """Cohere2VisionProcessor (hpcmem.trace.vision_cohere2_vision) on one image: its image tokens and pixel_values'
    tiles are the spec's, its markers start, end and one line break a tile."""
    pytest.importorskip("transformers")
    from hpcmem.trace.vision_aya_vision import BREAK, END, START

    job = _job(width, height)
    out, ids, g, proc = processed_one_image(job, height, width)
    assert int((ids == proc.image_token_id).sum()) == g.tokens
    assert out["pixel_values"].shape[0] == g.grid_thw[0]
    counts = [int((ids == t).sum()) for t in proc.tokenizer.convert_tokens_to_ids([START, END, BREAK])]
    assert counts == [1, 1, g.grid_thw[0]]


def test_a_text_config_without_a_learned_profile_is_refused(tmp_path):
    assert_refused_without_text_profile(CUT, tmp_path, num_hidden_layers=3)



def test_the_pooling_head_is_refused(tmp_path):
    """Cohere2VisionConfig's omitted vision_config keeps SiglipVisionConfig's vision_use_head true: the head runs on
    every tile, which is not modelled."""
    cfg = json.loads(CUT.read_text())
    cfg["vision_config"]["vision_use_head"] = True
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(SpecError, match="vision_use_head"):
        resolve_model(str(tmp_path / "config.json"))

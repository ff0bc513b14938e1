"""LFM2-VL's parts as hpcmem counts them (hpcmem.models.lfm2_vl; the language model from the learned profile of its
text config, hpcmem.models.vlm_learned) against `AutoModelForImageTextToText.from_config` on the meta device:
Siglip2VisionConfig's defaults cut to 2 layers, Lfm2Config's defaults cut to one conv and one attention layer; the
tiles against transformers' own Lfm2VlImageProcessor methods (image_processing_lfm2_vl.py), the image tokens counted
by Lfm2VlProcessor, the projector by hand."""

from __future__ import annotations

import ast
import json
from functools import lru_cache
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.job.images import image_geometry
from hpcmem.models.resolve import resolve_model
from hpcmem.validate.cases import case_job
from tests.helpers.meta_models import assert_tower_and_projector_match
from tests.helpers.vlm_cuts import assert_refused_without_text_profile, processed_one_image

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vlm"
CUT = FIXTURES / "lfm2-vl-L2-D2.json"


def _job(height: int, width: int):
    return case_job({"trainer": "sft", "model_name_or_path": str(CUT), "max_length": 4096, "images_per_example": 1,
                     "image_height": height, "image_width": width, "dtype": "bfloat16", "bf16": True})


@pytest.mark.torch
def test_parts_and_linears_equal_the_meta_model():
    """Tower (the patch embedding an nn.Linear, a 256-row position table, post_layernorm), projector (LayerNorm, two
    linears) and the LFM2 text part's parameters, and every nn.Linear of the tower and projector."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    model, spec = assert_tower_and_projector_match(CUT, "Lfm2VlForConditionalGeneration")
    emb = model.model.vision_tower.embeddings
    assert isinstance(emb.patch_embedding, torch.nn.Linear) and emb.position_embedding.num_embeddings == 256
    assert spec.vision.unused_params == 0          # last_hidden_state is read: post_layernorm trains
    assert spec.tie_word_embeddings is (model.get_output_embeddings().weight is model.get_input_embeddings().weight)


def test_projector_by_hand():
    """LayerNorm over 4 · 768 = 3072 (weight, bias), Linear(3072 → 2560) and Linear(2560 → 2560, Lfm2Config's
    hidden_size), both with bias (Lfm2VlConfig: projector_hidden_size 2560, projector_bias true)."""
    v = _job(384, 768).model.vision
    merger = {x.name: (x.in_features, x.out_features) for x in v.linears() if x.part == "merger"}
    assert merger == {"linear_1": (3072, 2560), "linear_2": (2560, 2560)}
    assert v.merger_params == 2 * 3072 + 3072 * 2560 + 2560 + 2560 * 2560 + 2560


@lru_cache(maxsize=1)
def _transformers_layout():
    """transformers' own Lfm2VlImageProcessor arithmetic (round_by_factor, find_closest_aspect_ratio and the methods
    _target_ratios, _get_grid_layout, smart_resize, _is_image_too_large), read out of image_processing_lfm2_vl.py:
    the module imports torchvision, which this environment lacks, so those functions are compiled from its source
    alone; `resize_and_split`'s choice between them (it calls torch) is the two lines mirrored here."""
    transformers = pytest.importorskip("transformers")
    import math

    path = Path(transformers.__file__).parent / "models" / "lfm2_vl" / "image_processing_lfm2_vl.py"
    tree = ast.parse(path.read_text())
    funcs = [n for n in tree.body if isinstance(n, ast.FunctionDef)
             and n.name in ("round_by_factor", "find_closest_aspect_ratio")]
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Lfm2VlImageProcessor")
    methods = [n for n in cls.body if isinstance(n, ast.FunctionDef)
               and n.name in ("_target_ratios", "_get_grid_layout", "smart_resize", "_is_image_too_large")]
    assert (len(funcs), len(methods)) == (2, 4)
    space = {"math": math, "lru_cache": lru_cache}
    exec(compile(ast.Module(body=funcs, type_ignores=[]), str(path), "exec"), space)
    body = ast.ClassDef(name="Real", bases=[], keywords=[], body=methods, decorator_list=[], type_params=[])
    exec(compile(ast.fix_missing_locations(ast.Module(body=[body], type_ignores=[])), str(path), "exec"), space)
    real = space["Real"]()

    def layout(height: int, width: int) -> tuple[int, int, tuple[int, int]]:
        large = real._is_image_too_large(height, width, 256, 16, 2, 2.0)
        w, h = real.smart_resize(height, width, 2, 64, 256, 16)
        if large:
            cols, rows, *_ = real._get_grid_layout(height, width, 2, 10, 512)
            return cols, rows, (h, w)
        return 1, 1, (h, w)

    return layout


@pytest.mark.torch
def test_the_tiles_are_transformers_own():
    real = _transformers_layout()
    v = _job(512, 512).model.vision
    sizes = (16, 100, 300, 384, 512, 600, 700, 768, 777, 1000, 1024, 1536, 2048, 3000, 5000)
    for h in sizes:
        for w in sizes:
            assert v.layout(h, w) == real(h, w), (h, w)


@pytest.mark.parametrize(("height", "width", "tiles", "tokens"),
                         [(384, 768, 1, 242), (512, 512, 1, 256), (1024, 1024, 5, 1280), (768, 1536, 9, 2290)])
def test_tiles_and_image_tokens_by_hand(height, width, tiles, tokens):
    """384×768: 294,912 px > 256 · 32² → scaled by √(294,912 / 262,144), floored to 32-px steps: 352×704, 22 × 44 =
    968 patches padded to 1,024 rows, 11 · 22 = 242 tokens. 1024×1024 is too large (> 2 · 262,144 px): the 2 × 2 grid
    (ties with 3 × 3 go to the larger only when the image covers half its area) and a 512-px thumbnail: 5 · 1,024
    rows, 4 · 256 + 256 tokens. 768×1536: 4 × 2 tiles and a 352×704 thumbnail: 8 · 256 + 242."""
    job = _job(height, width)
    g = image_geometry(job.train, job.model.vision)
    assert (g.grid_thw[0], g.patches, g.tokens) == (tiles, tiles * 1024, tokens)


@pytest.mark.torch
@pytest.mark.parametrize(("height", "width"), [(384, 768), (512, 512), (1024, 1024), (768, 1536), (300, 1000)])
def test_the_processor_writes_the_spec_s_tokens(height, width):
    """Lfm2VlProcessor around the PIL stand-in (hpcmem.trace.vision_lfm2_vl) on one image: its image tokens, pixel
    rows, unpadded rows and markers are the spec's."""
    pytest.importorskip("transformers")
    from hpcmem.trace.vision_lfm2_vl import END, START, THUMBNAIL, markers

    job = _job(height, width)
    v = job.model.vision
    out, ids, g, proc = processed_one_image(job, height, width)
    assert int((ids == proc.image_token_id).sum()) == g.tokens
    assert tuple(out["pixel_values"].shape) == (g.grid_thw[0], 1024, 768)
    assert bool((out["pixel_attention_mask"] == 0).any()) is v.padded(height, width)
    special = proc.tokenizer.convert_tokens_to_ids([START, END, THUMBNAIL])
    grid = [t for t in set(ids.tolist()) if proc.tokenizer.convert_ids_to_tokens(t).startswith("<|img_row_")]
    assert sum(int((ids == t).sum()) for t in (*special, *grid)) == markers(job)


def test_a_text_config_without_a_learned_profile_is_refused(tmp_path):
    assert_refused_without_text_profile(CUT, tmp_path, num_hidden_layers=3,
                                        layer_types=["conv", "full_attention", "conv"])



def test_the_pooling_head_is_refused(tmp_path):
    """Siglip2VisionConfig's default vision_use_head true: the head runs on every tile and its output is discarded,
    which is not modelled."""
    cfg = json.loads(CUT.read_text())
    del cfg["vision_config"]["vision_use_head"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(SpecError, match="vision_use_head"):
        resolve_model(str(tmp_path / "config.json"))

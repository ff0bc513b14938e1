"""Fuyu's parts as hpcmem counts them (its image path, vision_embed_tokens, in hpcmem.models.fuyu; the Persimmon
language model from the learned profile of its text config, hpcmem.models.vlm_learned) against
`AutoModelForImageTextToText.from_config` on the meta device, on the cut of estimator/cases/vlm-fuyu.yaml; peft's
all-linear targets on that model; the image tokens of a picture as transformers' FuyuProcessor and
FuyuImageProcessorPil make them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate.vision import vision_adapters
from hpcmem.models.resolve import resolve_model
from hpcmem.validate.cases import case_job
from tests.helpers.meta_models import meta_image_text_model, peft_all_linear_targets
from tests.helpers.vlm_cuts import assert_refused_without_text_profile

CUT = Path(__file__).resolve().parents[1] / "fixtures" / "vlm" / "fuyu-defaults-L2.json"
# (height, width) → (rows, columns) of 30 px patches: FuyuImageProcessorPil.resize fits an image larger than
# 1080 × 1920 into it (int() per side), FuyuProcessor._process_images rounds each side up to whole patches
GRIDS = {(448, 448): (15, 15), (672, 896): (23, 30), (2160, 3840): (36, 64), (100, 2500): (3, 64),
         (1080, 1920): (36, 64), (37, 61): (2, 3), (1500, 700): (36, 17)}


def _job(height: int, width: int, **extra):
    return case_job({"trainer": "sft", "model_name_or_path": str(CUT), "max_length": 4096, "images_per_example": 1,
                     "image_height": height, "image_width": width, "dtype": "bfloat16", "bf16": True, **extra})


def test_the_patch_linear_by_hand():
    """modeling_fuyu.py FuyuModel: vision_embed_tokens Linear(30 · 30 · 3 → 4096) with bias; the head untied
    (FuyuConfig.tie_word_embeddings False)."""
    spec = resolve_model(str(CUT))
    (linear,) = spec.vision.linears()
    assert (linear.name, linear.in_features, linear.out_features) == ("vision_embed_tokens", 2700, 4096)
    assert spec.vision.num_params == 2700 * 4096 + 4096
    assert spec.tie_word_embeddings is False
    assert spec.num_hidden_layers == 2 and spec.hidden_size == 4096


@pytest.mark.torch
def test_parts_and_linears_equal_the_meta_model():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    model = meta_image_text_model(json.loads(CUT.read_text()))
    assert type(model).__name__ == "FuyuForCausalLM"
    spec = resolve_model(str(CUT))
    count = {"vision": 0, "language": 0}
    for name, p in model.named_parameters():
        count["vision" if ".vision_embed_tokens." in name else "language"] += p.numel()
    assert count == {"vision": spec.vision.num_params, "language": spec.num_params}
    linears = {n.rsplit(".", 1)[-1]: (m.in_features, m.out_features) for n, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and "vision_embed_tokens" in n}
    assert linears == {x.name: (x.in_features, x.out_features) for x in spec.vision.linears()}
    assert spec.tie_word_embeddings is (model.get_output_embeddings().weight is model.get_input_embeddings().weight)
    assert spec.learned is not None


@pytest.mark.torch
def test_peft_all_linear_reaches_what_the_spec_adapts():
    """peft's all-linear on the real model (peft/tuners/tuners_utils.py `_maybe_include_all_linear_layers`: every
    nn.Linear but the output embedding): vision_embed_tokens is hpcmem's `vision_adapters`."""
    pytest.importorskip("torch")
    pytest.importorskip("peft")

    model = meta_image_text_model(json.loads(CUT.read_text()))
    targets = peft_all_linear_targets(model)
    assert "model.vision_embed_tokens" in targets and not any(t.endswith("lm_head") for t in targets)
    job = _job(448, 448, use_peft=True, lora_target_modules="all-linear")
    assert [x.name for x in vision_adapters(job, job.model.vision)] == ["vision_embed_tokens"]


@pytest.mark.torch
@pytest.mark.parametrize(("height", "width"), sorted(GRIDS))
def test_the_processor_counts_the_spec_s_image_tokens(height, width):
    """FuyuProcessor (hpcmem.trace.vision `processor`, transformers' own class) through the trace's chat template on
    one image: its |SPEAKER| tokens and patch rows are hpcmem.job.images' geometry, the rest of the row
    hpcmem.trace.vision_fuyu `markers` and the words."""
    pytest.importorskip("transformers")
    from PIL import Image
    from transformers.models.fuyu.processing_fuyu import FuyuProcessor

    from hpcmem.job.images import image_geometry
    from hpcmem.trace.vision import processor
    from hpcmem.trace.vision_fuyu import markers

    job = _job(height, width)
    proc = processor(job)
    assert isinstance(proc, FuyuProcessor)
    messages = [[{"role": "user", "content": [{"type": "image", "image": Image.new("RGB", (width, height))},
                                               {"type": "text", "text": "t3 t3"}]}]]
    out = proc.apply_chat_template(messages, tokenize=True, return_dict=True, return_tensors="pt",
                                   processor_kwargs={"add_special_tokens": False})
    g = image_geometry(job.train, job.model.vision)
    rows, cols = GRIDS[(height, width)]
    assert g.grid_thw == (1, rows, cols) and g.tokens == g.patches == rows * cols
    ids = out["input_ids"][0]
    assert int((ids == proc.image_token_id).sum()) == g.tokens
    assert int((ids == proc.image_newline_id).sum()) == rows
    assert tuple(out["image_patches"].shape) == (g.patches, job.model.vision.patch_dim)
    assert len(ids) == g.tokens + markers(job) + 2


def test_two_images_a_row_and_pixel_bounds_are_refused():
    """FuyuProcessor writes one image placeholder per sample; FuyuImageProcessor has no min_pixels / max_pixels."""
    from hpcmem.estimate import estimate

    with pytest.raises(SpecError, match="FuyuProcessor places one image per row"):
        estimate(_job(448, 448, images_per_example=2))
    with pytest.raises(SpecError, match="FuyuImageProcessor has no such setting"):
        estimate(_job(448, 448, min_pixels=1000))


def test_a_text_config_without_a_learned_profile_is_refused(tmp_path):
    assert_refused_without_text_profile(CUT, tmp_path, num_hidden_layers=3)

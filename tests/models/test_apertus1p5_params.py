"""Apertus 1.5's parts as hpcmem counts them (hpcmem.models.apertus1p5: the vision tokenizer and the idle WavTokenizer
audio encoder at their config classes' defaults, the language model from the learned profile of its apertus1p5_text
config, hpcmem.models.vlm_learned) against `AutoModelForImageTextToText.from_config` on the meta device, on the cut of
estimator/cases/vlm-apertus1p5.yaml; peft's all-linear targets on that model; the image tokens a picture takes
counted by transformers' Apertus1p5Processor (around the trace's PIL stand-in for its torchvision-only image
processor) and by Apertus1p5ImageProcessor's own `smart_resize`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate.vision import vision_adapters
from hpcmem.models.apertus1p5 import apertus1p5_tower_from_config
from hpcmem.models.resolve import resolve_model
from hpcmem.validate.cases import case_job
from tests.helpers.meta_models import meta_image_text_model, peft_all_linear_targets
from tests.helpers.vlm_cuts import assert_refused_without_text_profile

CUT = Path(__file__).resolve().parents[1] / "fixtures" / "vlm" / "apertus1p5-defaults-L2-D2.json"
SIZES = [(512, 512), (672, 896), (300, 500), (1000, 1000), (1500, 700), (100, 120), (3000, 2000)]


def _job(height: int, width: int, **extra):
    return case_job({"trainer": "sft", "model_name_or_path": str(CUT), "max_length": 8192, "images_per_example": 1,
                     "image_height": height, "image_width": width, "dtype": "bfloat16", "bf16": True, **extra})


def test_the_default_tokenizer_by_hand():
    """Apertus1p5VisionTokenizerConfig's defaults: 5 stages (16 px per code), attention at stage 4 (256 / 2⁴ = 16 in
    attn_resolutions); 512 × 512 px → 32 × 32 = 1,024 codes; 100 × 120 px rounded to 96 × 128 = 12,288 px < 128²,
    scaled up by sqrt(16384 / 12000) to ceil(116.8 / 16) · 16 = 128 by ceil(140.2 / 16) · 16 = 144 → 8 × 9 = 72."""
    v = apertus1p5_tower_from_config({"model_type": "apertus1p5"}, "x")
    assert (v.patch_size, v.attn_stages, v.widths) == (16, (4,), (256, 256, 512, 512, 1024))
    assert v.image_tokens(512, 512) == 1024 and v.image_tokens(100, 120) == 72
    assert [x.name for x in v.linears()] == ["quantize.embedding"]


def test_what_it_does_not_model_is_refused():
    with pytest.raises(SpecError, match="audio_config.model_type"):
        apertus1p5_tower_from_config({"model_type": "apertus1p5", "audio_config": {"model_type": "encodec"}}, "x")
    with pytest.raises(SpecError, match="channel_multiplier"):
        apertus1p5_tower_from_config({"model_type": "apertus1p5", "vision_config": {"channel_multiplier": [1, 0]}},
                                     "x")


@pytest.mark.torch
def test_parts_and_linears_equal_the_meta_model():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    model = meta_image_text_model(json.loads(CUT.read_text()))
    assert type(model).__name__ == "Apertus1p5ForConditionalGeneration"
    spec = resolve_model(str(CUT))
    inner = model.model

    def count(m):
        return sum(p.numel() for p in m.parameters())
    assert count(inner.vision_tokenizer.encoder) + count(inner.vision_tokenizer.quant_conv) == spec.vision.tower_params
    assert count(inner.vision_tokenizer.quantize) == spec.vision.merger_params
    assert count(inner.audio_tokenizer) == spec.vision.audio_params
    assert count(inner.language_model) + count(model.lm_head) == spec.num_params
    linears = {n.rsplit("vision_tokenizer.", 1)[-1]: (m.in_features, m.out_features)
               for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and "vision_tokenizer." in n}
    assert linears == {x.name: (x.in_features, x.out_features) for x in spec.vision.linears()}
    assert not any(isinstance(m, torch.nn.Linear) for m in inner.audio_tokenizer.modules())
    assert spec.tie_word_embeddings is False
    assert model.get_output_embeddings().weight is not model.get_input_embeddings().weight
    # both tokenizers stay fp32 whatever the load dtype (`_keep_in_fp32_modules_strict`)
    assert "vision_tokenizer" in model._keep_in_fp32_modules_strict and spec.learned is not None


@pytest.mark.torch
def test_peft_all_linear_reaches_what_the_spec_adapts():
    """peft's all-linear on the real model: every nn.Linear but the output embedding; in the tokenizers that is the
    quantizer's codebook Linear alone (the convolutions and the audio encoder's LSTM are none)."""
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    model = meta_image_text_model(json.loads(CUT.read_text()))
    targets = peft_all_linear_targets(model)
    job = _job(512, 512, use_peft=True, lora_target_modules="all-linear")
    theirs = {t.rsplit("vision_tokenizer.", 1)[-1] for t in targets if "tokenizer." in t}
    assert theirs == {x.name for x in vision_adapters(job, job.model.vision)}
    assert "lm_head" not in targets


@pytest.mark.torch
@pytest.mark.parametrize(("height", "width"), SIZES)
def test_the_processor_counts_the_spec_s_image_tokens(height, width):
    """Apertus1p5Processor (transformers' own class) on one image: its image tokens, pixel_values [1, 3, h, w],
    image_sizes and markers are the spec's; the size is image_processing_apertus1p5.py's own `smart_resize`'s."""
    pytest.importorskip("transformers")
    from PIL import Image

    from hpcmem.job.images import image_geometry
    from hpcmem.trace.vision import processor
    from hpcmem.trace.vision_apertus1p5 import TOKENS, markers

    job = _job(height, width)
    proc = processor(job)
    out = proc(text=[TOKENS["image_token"] + " t3"], images=[[Image.new("RGB", (width, height))]],
               return_tensors="pt")
    g = image_geometry(job.train, job.model.vision)
    assert tuple(out["pixel_values"].shape) == (1, 3, *g.resized)
    assert tuple(out["image_sizes"][0].tolist()) == g.resized
    assert int((out["input_ids"][0] == proc.image_token_id).sum()) == g.tokens
    assert out["input_ids"].shape[1] == g.tokens + markers(job) + 1
    h, w = _their_smart_resize()(height, width, factor=16, min_pixels=128 * 128, max_pixels=1400 * 1400)
    assert (h, w) == g.resized


def _their_smart_resize():
    """image_processing_apertus1p5.py's `smart_resize`, its own source (the module imports torchvision, which is not
    installed here): the function's definition taken from the file and run."""
    import ast
    import importlib.util
    import math

    path = Path(importlib.util.find_spec("transformers.models.apertus1p5").submodule_search_locations[0])
    tree = ast.parse((path / "image_processing_apertus1p5.py").read_text(encoding="utf-8"))
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "smart_resize")
    scope: dict = {"math": math}
    exec(compile(ast.Module(body=[node], type_ignores=[]), "smart_resize", "exec"), scope)  # noqa: S102
    return scope["smart_resize"]


def test_a_text_config_without_a_learned_profile_is_refused(tmp_path):
    assert_refused_without_text_profile(CUT, tmp_path, num_hidden_layers=3)


def test_pixel_bounds_reach_the_processor_by_its_own_keys():
    """min_pixels / max_pixels: the geometry's smart_resize bounds and the processor keywords Apertus1p5ImageProcessor
    reads (`resize`: size.min_pixels, size.max_pixels); 512 × 512 under max_pixels 256² → 256 × 256, 16 × 16 codes."""
    from hpcmem.job.images import image_geometry, processor_kwargs

    job = _job(512, 512, max_pixels=256 * 256)
    assert image_geometry(job.train, job.model.vision).tokens == 256
    assert processor_kwargs(job.train, job.model.vision) == {"size": {"min_pixels": 128 * 128,
                                                                      "max_pixels": 256 * 256}}

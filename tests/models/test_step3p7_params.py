"""Step 3.7 Flash's parts as hpcmem counts them (its tower, downsamplers and projector in hpcmem.models.step3p7, the
language model from the learned profile of its step3p5 text config, hpcmem.models.vlm_learned) against
`AutoModelForImageTextToText.from_config` on the meta device, on the cut of estimator/cases/vlm-step3p7.yaml; peft's
all-linear targets on that model; the crops, patches and image tokens of a picture as transformers' Step3p7Processor
(around hpcmem.trace.vision_step3p7's torch resize/normalize for its torchvision-only image processor) makes them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate.vision import vision_adapters
from hpcmem.job.images import image_geometry
from hpcmem.models.resolve import resolve_model
from hpcmem.models.step3p7 import step3p7_tower_from_config
from hpcmem.validate.cases import case_job
from tests.helpers.meta_models import meta_image_text_model, meta_part_counts, peft_all_linear_targets
from tests.helpers.vlm_cuts import assert_refused_without_text_profile

CUT = Path(__file__).resolve().parents[1] / "fixtures" / "vlm" / "step3p7-defaults-L2-D2.json"


def _job(height: int, width: int, **extra):
    return case_job({"trainer": "sft", "model_name_or_path": str(CUT), "max_length": 4096, "images_per_example": 1,
                     "image_height": height, "image_width": width, "dtype": "bfloat16", "bf16": True, **extra})


def _vision_name(name: str) -> str | None:
    """A meta model module's name as hpcmem's TowerLinear names it: below `vision_model.layers.N.` as
    `blocks.N.<name>`, the projector as `multi_modal_projector`; None elsewhere."""
    if "vision_model.layers." in name:
        return "blocks." + name.split("vision_model.layers.", 1)[1]
    if name.endswith("multi_modal_projector"):
        return "multi_modal_projector"
    return None


def test_the_parts_by_hand():
    """configuration_step3p7.py defaults: width 1536, intermediate int(1536 · 8960 / 1536) = 8960, 16 heads, 728 px
    at 14 px patches (2,704 positions). Per layer: q/k/v/out_proj 4 · (1536² + 1536) = 9,443,328, fc1 1536 · 8960 +
    8960 = 13,771,520, fc2 8960 · 1536 + 1536 = 13,764,096, two LayerNorms and lambda_1, lambda_2 6 · 1536 = 9,216:
    36,988,160. Embeddings 588 · 1536 + 2704 · 1536 = 5,056,512; pre_layernorm 3,072; downsampler1 9 · 1536 · 3072 +
    3072 = 42,470,400; downsampler2 9 · 3072 · 6144 + 6144 = 169,875,456. Projector 6144 · 4096 (no bias)."""
    spec = resolve_model(str(CUT))
    v = spec.vision
    assert v.block_params == 36_988_160
    assert v.tower_params == 5_056_512 + 3_072 + 2 * 36_988_160 + 42_470_400 + 169_875_456
    assert v.merger_params == 6144 * 4096
    assert spec.tie_word_embeddings is False


@pytest.mark.torch
def test_parts_and_linears_equal_the_meta_model():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    model = meta_image_text_model(json.loads(CUT.read_text()))
    assert type(model).__name__ == "Step3p7ForConditionalGeneration"
    spec = resolve_model(str(CUT))
    count = meta_part_counts(model, tower=".vision_model.", merger=".multi_modal_projector")
    assert count == {"tower": spec.vision.tower_params, "merger": spec.vision.merger_params,
                     "language": spec.num_params}
    linears = {_vision_name(n): (m.in_features, m.out_features) for n, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and _vision_name(n)}
    ours = {(f"blocks.{i}.{x.name}" if x.part == "tower" else x.name): (x.in_features, x.out_features)
            for x in spec.vision.linears() for i in range(x.count)}
    assert linears == ours
    assert spec.tie_word_embeddings is (model.get_output_embeddings().weight is model.get_input_embeddings().weight)
    assert spec.learned is not None


@pytest.mark.torch
def test_peft_all_linear_reaches_what_the_spec_adapts():
    """peft's all-linear on the real model: every nn.Linear but the output embedding (the Conv2d downsamplers are
    none); its tower and projector targets are hpcmem's `vision_adapters`."""
    pytest.importorskip("torch")
    pytest.importorskip("peft")

    model = meta_image_text_model(json.loads(CUT.read_text()))
    targets = peft_all_linear_targets(model)
    theirs = sorted(n for n in (_vision_name(t) for t in targets) if n)
    job = _job(728, 728, use_peft=True, lora_target_modules="all-linear")
    ours = sorted(f"blocks.{i}.{x.name}" if x.part == "tower" else x.name
                  for x in vision_adapters(job, job.model.vision) for i in range(x.count))
    assert theirs == ours
    assert "lm_head" not in targets


@pytest.mark.torch
@pytest.mark.parametrize(("height", "width", "crops", "tokens"),
                         [(728, 728, 0, 169), (1008, 1008, 4, 169 + 4 * 81), (504, 1008, 2, 169 + 2 * 81),
                          (300, 500, 1, 169 + 81), (2000, 3000, 24, 169 + 24 * 81)])
def test_the_processor_counts_the_spec_s_crops_and_tokens(height, width, crops, tokens):
    """Step3p7Processor (hpcmem.trace.vision `processor`: transformers' own class and image processor, torch's
    resize and normalize) on one image: its local crops (pixel_values_local [crops, 3, 504, 504]), image tokens and
    markers are the spec's. By hand (`_plan_patches`): 728² fits the global view: no crops; 1008² takes 504-px windows,
    2 × 2; 504 × 1008 is 2 across, 1 down; 300 × 500 (within the global view, 5:3 > 1.5) takes 300-px windows: 500 px
    is one (the rest 200 under a fifth? no: 200 > 60, snapped up to 600, 2 across) — counted below by the real class;
    3000 × 2000 is 6 across (3000 / 504 = 5 rest 480 > 100.8) and 4 down (2000 / 504 = 3 rest 488)."""
    pytest.importorskip("transformers")
    from PIL import Image
    from transformers.models.step3p7.processing_step3p7 import Step3p7Processor

    from hpcmem.trace.vision import processor

    job = _job(height, width)
    proc = processor(job)
    assert isinstance(proc, Step3p7Processor)
    out = proc(text=[proc.image_token + " t3"], images=[[Image.new("RGB", (width, height))]], return_tensors="pt")
    v = job.model.vision
    x, y = v.crops(height, width)
    got = 0 if "pixel_values_local" not in out else out["pixel_values_local"].shape[0]
    assert got == x * y
    assert tuple(out["pixel_values"].shape) == (1, 3, 728, 728)
    g = image_geometry(job.train, v)
    ids = out["input_ids"][0]
    assert int((ids == proc.image_token_id).sum()) == g.tokens
    assert len(ids) == g.tokens + v.markers(height, width) + 1
    assert g.patches == 2704 + got * 1296
    if (height, width) != (300, 500):
        assert (got, g.tokens) == (crops, tokens)


def test_the_legacy_vision_spellings_are_refused():
    cfg = json.loads(CUT.read_text())
    cfg["vision_config"]["width"] = 1536
    with pytest.raises(SpecError, match="legacy spelling"):
        step3p7_tower_from_config(cfg, "cut")


def test_a_text_config_without_a_learned_profile_is_refused(tmp_path):
    assert_refused_without_text_profile(CUT, tmp_path, num_hidden_layers=3)


def test_pixel_bounds_and_extreme_aspect_ratios_are_refused():
    with pytest.raises(SpecError, match="Step3p7ImageProcessor has no such setting"):
        _job(728, 728, min_pixels=1000)
    with pytest.raises(SpecError, match="pads an image under 32 px"):
        _job(20, 400)

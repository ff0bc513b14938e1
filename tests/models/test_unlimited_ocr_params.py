"""Unlimited-OCR's vision part as hpcmem counts it (hpcmem.models.unlimited_ocr: DeepSeek-OCR 2's SAM tower with its
neck and convolutions, the CLIP encoder over its features, the projector, image newline and view separator) against
`AutoModelForImageTextToText.from_config` on the meta device, on the cut of estimator/cases/vlm-unlimited-ocr.yaml;
peft's all-linear targets on that model; the image tokens and views transformers' UnlimitedOcrProcessor makes around
the trace's PIL stand-in for its torchvision-only image processor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate.vision import vision_adapters
from hpcmem.job.images import image_geometry
from hpcmem.models.coverage_vlm import vision_language_reason
from hpcmem.models.resolve import resolve_model
from hpcmem.models.unlimited_ocr import unlimited_ocr_tower_from_config
from hpcmem.validate.cases import case_job
from tests.helpers.meta_models import meta_image_text_model, peft_all_linear_targets

CUT = Path(__file__).resolve().parents[1] / "fixtures" / "vlm" / "unlimited-ocr-defaults-L2-D2.json"


def _job(height: int = 640, width: int = 640, **extra):
    return case_job({"trainer": "sft", "model_name_or_path": str(CUT), "max_length": 8192, "images_per_example": 1,
                     "image_height": height, "image_width": width, "dtype": "bfloat16", "bf16": True, **extra})


def _name(name: str) -> str | None:
    """A meta model module's name as hpcmem's TowerLinear rows name it: SAM's below `sam_encoder.layers.N.` as
    `sam.N.<name>`, the encoder's below `vision_encoder.encoder.layers.N.` as `encoder.N.<name>`, the projector's as
    is."""
    for prefix, ours in (("model.vision_tower.sam_encoder.layers.", "sam."),
                         ("model.vision_tower.vision_encoder.encoder.layers.", "encoder.")):
        if name.startswith(prefix):
            return ours + name[len(prefix):]
    return "multi_modal_projector" if name == "model.multi_modal_projector" else None


def _ours(linears) -> list[str]:
    return sorted(x.name if x.part == "merger" else f"{x.part}.{i}.{x.name}" for x in linears for i in range(x.count))


def test_the_tower_by_hand():
    """The cut: SAM's 16 × 16 features at 1024 px (10 × 10 at 640); a 640 × 640 image is the global view alone:
    16 rows of 16 tokens and a newline, and a separator: 273; 768 × 1536 (h × w) cuts into 2 × 1 tiles of 640 px:
    10 rows of 2 · 10 tokens and a newline more, 273 + 210 = 483; the projector reads 1024 + 1024."""
    v = resolve_model(str(CUT)).vision
    assert (v.features(1024), v.features(640)) == (256, 100)
    assert v.image_tokens(640, 640) == 273 and v.tiles(640, 640) == 0
    assert v.tiles(768, 1536) == 2 and v.image_tokens(768, 1536) == 483
    assert v.image_patches(768, 1536) == 4096 + 2 * 1600
    by_name = {x.name: (x.in_features, x.out_features) for x in v.linears()}
    assert by_name["multi_modal_projector"] == (2048, 1280) and by_name["mlp.fc1"] == (1024, 4096)


@pytest.mark.torch
def test_parts_and_linears_equal_the_meta_model():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    model = meta_image_text_model(json.loads(CUT.read_text()))
    assert type(model).__name__ == "UnlimitedOcrForConditionalGeneration"
    spec = resolve_model(str(CUT))
    count = {"sam": 0, "encoder": 0, "merger": 0, "language": 0}
    for name, p in model.named_parameters():
        count["sam" if ".sam_encoder." in name else
              "encoder" if ".vision_tower." in name else
              "merger" if ".multi_modal_projector." in name or name.endswith(("view_separator", "image_newline")) else
              "language"] += p.numel()
    v = spec.vision
    assert count == {"sam": v.sam_params, "encoder": v.tower_params - v.sam_params, "merger": v.merger_params,
                     "language": spec.num_params}
    theirs = sorted(n for n in (_name(n) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)) if n)
    assert theirs == _ours(v.linears())
    assert spec.tie_word_embeddings is (model.get_output_embeddings().weight is model.get_input_embeddings().weight)


@pytest.mark.torch
def test_peft_all_linear_reaches_what_the_spec_adapts():
    pytest.importorskip("torch")
    pytest.importorskip("peft")

    model = meta_image_text_model(json.loads(CUT.read_text()))
    targets = peft_all_linear_targets(model)
    theirs = sorted(n for n in (_name(t) for t in targets) if n)
    job = _job(use_peft=True, lora_target_modules="all-linear")
    assert theirs == _ours(vision_adapters(job, job.model.vision))
    assert "lm_head" not in targets


@pytest.mark.torch
@pytest.mark.parametrize(("height", "width"), [(640, 640), (768, 1536), (1000, 900), (2048, 1536), (3000, 700),
                                               (641, 500)])
def test_the_processor_makes_the_spec_s_tokens_and_views(height, width):
    """UnlimitedOcrProcessor (transformers' own class) around the trace's stand-in image processor on one image: the
    spec's image tokens and nothing around them, a 1024 px global view and the spec's 640 px tiles."""
    pytest.importorskip("transformers")
    from PIL import Image
    from transformers.models.unlimited_ocr.processing_unlimited_ocr import UnlimitedOcrProcessor

    from hpcmem.trace.vision import processor

    job = _job(height, width)
    proc = processor(job)
    assert isinstance(proc, UnlimitedOcrProcessor)
    out = proc(text=[proc.image_token + " t3"], images=[[Image.new("RGB", (width, height))]], return_tensors="pt")
    ids = out["input_ids"][0]
    tokens = image_geometry(job.train, job.model.vision).tokens
    assert int((ids == proc.image_token_id).sum()) == tokens
    assert len(ids) == tokens + 1
    assert tuple(out["pixel_values"].shape) == (1, 3, 1024, 1024)
    tiles = job.model.vision.tiles(height, width)
    assert out["num_local_patches"] == [tiles]
    if tiles:
        assert tuple(out["pixel_values_local"].shape) == (tiles, 3, 640, 640)
        assert out["patches_grid"] == [list(job.model.vision.canvas(height, width))]


@pytest.mark.torch
def test_the_stand_in_crops_as_the_torchvision_processor_does():
    """UnlimitedOcrImageProcessor (image_processing_unlimited_ocr.py) cuts tiles with DeepseekOcr2ImageProcessor's
    `crop_image_to_patches` over GotOcr2's `get_optimal_tiled_canvas`; the stand-in's PIL parent
    (image_processing_pil_deepseek_ocr2.py) uses its own copy of that function: the same canvas at every shape
    between 1 and 4096 px in 97 px steps."""
    pytest.importorskip("transformers")
    from transformers.models.deepseek_ocr2.image_processing_pil_deepseek_ocr2 import get_optimal_tiled_canvas as pil
    from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import get_optimal_tiled_canvas as got

    for h in range(1, 4097, 97):
        for w in range(1, 4097, 97):
            assert pil((h, w), (640, 640), 2, 32) == got((h, w), (640, 640), 2, 32)


def test_estimated_not_refused():
    assert vision_language_reason("unlimited_ocr") is None


def test_sam_features_of_another_width_than_the_encoder_s_are_refused():
    cfg = json.loads(CUT.read_text())
    cfg["vision_config"]["encoder_config"]["hidden_size"] = 1280
    cfg["vision_config"]["encoder_config"]["num_attention_heads"] = 16
    with pytest.raises(SpecError, match="downsample_channels"):
        unlimited_ocr_tower_from_config(cfg, "cut")

"""DeepSeek-OCR 2's vision part as hpcmem counts it (hpcmem.models.deepseek_ocr2: the SAM tower with its neck and
convolutions, the Qwen2 encoder and its query tables, the projector and view separator) against
`AutoModelForImageTextToText.from_config` on the meta device, on the cut of estimator/cases/vlm-deepseek-ocr2.yaml;
peft's all-linear targets on that model; the image tokens and views transformers' DeepseekOcr2Processor makes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate.vision import vision_adapters
from hpcmem.job.images import image_geometry
from hpcmem.models.coverage_vlm import vision_language_reason
from hpcmem.models.deepseek_ocr2 import deepseek_ocr2_tower_from_config
from hpcmem.models.resolve import resolve_model
from hpcmem.validate.cases import case_job
from tests.helpers.meta_models import meta_image_text_model, peft_all_linear_targets

CUT = Path(__file__).resolve().parents[1] / "fixtures" / "vlm" / "deepseek-ocr2-defaults-L2-D2.json"


def _job(height: int = 640, width: int = 640, **extra):
    return case_job({"trainer": "sft", "model_name_or_path": str(CUT), "max_length": 2048, "images_per_example": 1,
                     "image_height": height, "image_width": width, "dtype": "bfloat16", "bf16": True, **extra})


def _name(name: str) -> str | None:
    """A meta model module's name as hpcmem's TowerLinear rows name it: SAM's below `sam_encoder.layers.N.` as
    `sam.N.<name>`, the encoder's below `vision_encoder.layers.N.` as `encoder.N.<name>`, the projector's as is."""
    for prefix, ours in (("model.vision_tower.sam_encoder.layers.", "sam."),
                         ("model.vision_tower.vision_encoder.layers.", "encoder.")):
        if name.startswith(prefix):
            return ours + name[len(prefix):]
    return "multi_modal_projector" if name == "model.multi_modal_projector" else None


def _ours(linears) -> list[str]:
    return sorted(x.name if x.part == "merger" else f"{x.part}.{i}.{x.name}" for x in linears for i in range(x.count))


def test_the_tower_by_hand():
    """The cut: SAM's 64 × 64 patches at 1024 px (48 × 48 at 768), through two stride-2 3 × 3 convolutions to
    16 × 16 = 256 and 12 × 12 = 144 features; a 640 × 640 image (longest side ≤ 768) is the global view alone:
    256 + 1 tokens; 768 × 1536 (h × w) cuts into 2 × 1 tiles (aspect 2 among 2..6 tiles): 256 + 2 · 144 + 1."""
    v = resolve_model(str(CUT)).vision
    assert (v.features(1024), v.features(768)) == (256, 144)
    assert v.image_tokens(640, 640) == 257 and v.image_patches(640, 640) == 4096
    assert v.tiles(768, 1536) == 2 and v.image_tokens(768, 1536) == 545
    assert v.image_patches(768, 1536) == 4096 + 2 * 2304
    by_name = {x.name: (x.in_features, x.out_features) for x in v.linears()}
    assert by_name["self_attn.k_proj"] == (896, 128) and by_name["mlp.gate_proj"] == (896, 4864)
    assert by_name["multi_modal_projector"] == (896, 1280) and by_name["attn.qkv"] == (768, 2304)


@pytest.mark.torch
def test_parts_and_linears_equal_the_meta_model():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    model = meta_image_text_model(json.loads(CUT.read_text()))
    assert type(model).__name__ == "DeepseekOcr2ForConditionalGeneration"
    spec = resolve_model(str(CUT))
    count = {"sam": 0, "encoder": 0, "merger": 0, "language": 0}
    for name, p in model.named_parameters():
        count["sam" if ".sam_encoder." in name else
              "encoder" if ".vision_tower." in name else
              "merger" if ".multi_modal_projector." in name or name.endswith("view_separator") else
              "language"] += p.numel()
    v = spec.vision
    assert count == {"sam": v.sam_params, "encoder": v.tower_params - v.sam_params, "merger": v.merger_params,
                     "language": spec.num_params}
    theirs = sorted(n for n in (_name(n) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)) if n)
    assert theirs == _ours(v.linears())
    assert spec.tie_word_embeddings is (model.get_output_embeddings().weight is model.get_input_embeddings().weight)


@pytest.mark.torch
def test_peft_all_linear_reaches_what_the_spec_adapts():
    """peft's all-linear (peft/tuners/tuners_utils.py `_maybe_include_all_linear_layers`: every nn.Linear but the
    output embedding): its SAM, encoder and projector targets are hpcmem's `vision_adapters`."""
    pytest.importorskip("torch")
    pytest.importorskip("peft")

    model = meta_image_text_model(json.loads(CUT.read_text()))
    targets = peft_all_linear_targets(model)
    theirs = sorted(n for n in (_name(t) for t in targets) if n)
    job = _job(use_peft=True, lora_target_modules="all-linear")
    assert theirs == _ours(vision_adapters(job, job.model.vision))
    assert "lm_head" not in targets


@pytest.mark.torch
@pytest.mark.parametrize(("height", "width"), [(640, 640), (768, 1536), (1000, 900), (1536, 1024), (2000, 700),
                                               (769, 500)])
def test_the_processor_makes_the_spec_s_tokens_and_views(height, width):
    """DeepseekOcr2Processor (hpcmem.trace.vision `processor`, transformers' own class) on one image: the spec's
    image tokens and nothing around them, a 1024 px global view and the spec's 768 px tiles."""
    pytest.importorskip("transformers")
    from PIL import Image
    from transformers.models.deepseek_ocr2.processing_deepseek_ocr2 import DeepseekOcr2Processor

    from hpcmem.trace.vision import processor

    job = _job(height, width)
    proc = processor(job)
    assert isinstance(proc, DeepseekOcr2Processor)
    out = proc(text=[proc.image_token + " t3"], images=[[Image.new("RGB", (width, height))]], return_tensors="pt")
    ids = out["input_ids"][0]
    tokens = image_geometry(job.train, job.model.vision).tokens
    assert int((ids == proc.image_token_id).sum()) == tokens
    assert len(ids) == tokens + 1
    assert tuple(out["pixel_values"].shape) == (1, 3, 1024, 1024)
    tiles = job.model.vision.tiles(height, width)
    assert tiles == int(out["num_local_patches"][0])
    if tiles:
        assert tuple(out["pixel_values_local"].shape) == (tiles, 3, 768, 768)


def test_estimated_not_refused():
    assert vision_language_reason("deepseek_ocr2") is None


def test_an_encoder_narrower_than_the_sam_features_is_refused():
    """DeepseekOcr2VisionModel concatenates the SAM features (downsample_channels[1] wide) with the queries."""
    cfg = json.loads(CUT.read_text())
    cfg["vision_config"]["encoder_config"]["hidden_size"] = 1024
    with pytest.raises(SpecError, match="downsample_channels"):
        deepseek_ocr2_tower_from_config(cfg, "cut")


@pytest.mark.torch
def test_the_learned_text_part_is_the_model_s_decoder():
    """`deepseek_ocr2_text` maps to no model class; the trace's stand-in (hpcmem.trace.text_heads) is transformers' own
    DeepseekOcr2TextModel under an untied head: the same parameters as the real model's language model and lm_head,
    and the same experts implementation (grouped_mm) and attention."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from hpcmem.models.vision import text_part
    from hpcmem.trace import text_heads

    text_heads.register()
    cfg = json.loads(CUT.read_text())
    model = meta_image_text_model(cfg)
    text = dict(text_part(cfg))
    config = transformers.AutoConfig.for_model(text.pop("model_type"), **text)
    with torch.device("meta"):
        lm = transformers.AutoModelForCausalLM.from_config(config)
    ours = sum(p.numel() for p in lm.parameters())
    theirs = sum(p.numel() for n, p in model.named_parameters() if ".language_model." in n or n.startswith("lm_head"))
    assert ours == theirs
    assert lm.config._experts_implementation == model.config.text_config._experts_implementation == "grouped_mm"
    assert lm.config._attn_implementation == model.config.text_config._attn_implementation

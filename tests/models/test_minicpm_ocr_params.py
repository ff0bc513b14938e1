"""MiniCPM-OCR's parts as hpcmem counts them (MiniCPM-V 4.6's tower spec at downsample_mode "4x" under model type
minicpm_ocr, hpcmem.models.minicpm_ocr; the language model from the learned profile of its Qwen3.5 text config,
head tied) against `AutoModelForImageTextToText.from_config` on the meta device, on the cut of
estimator/cases/vlm-minicpm-ocr.yaml; peft's all-linear targets on that model; the image tokens and slices of
transformers' MiniCPMOcrProcessor around the PIL image processor at "4x"; the window merger the real forward leaves
idle."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcmem.errors import SpecError
from hpcmem.estimate.vision import vision_adapters
from hpcmem.job.images import image_geometry
from hpcmem.models.minicpm_ocr import minicpm_ocr_tower_from_config
from hpcmem.models.resolve import resolve_model
from hpcmem.validate.cases import case_job
from tests.helpers.meta_models import meta_image_text_model, meta_part_counts, peft_all_linear_targets

CUT = Path(__file__).resolve().parents[1] / "fixtures" / "vlm" / "minicpm-ocr-defaults-L2-D2.json"


def _job(height: int, width: int, **extra):
    return case_job({"trainer": "sft", "model_name_or_path": str(CUT), "max_length": 4096, "images_per_example": 1,
                     "image_height": height, "image_width": width, "dtype": "bfloat16", "bf16": True, **extra})


def _vision_name(name: str) -> str | None:
    """As tests/models/test_minicpmv4_6_params.py names a meta model's vision linears."""
    for prefix in ("vision_tower.encoder.layers.", "vision_tower.", "model.merger."):
        if prefix in name:
            rest = name.split(prefix, 1)[1]
            return f"blocks.{rest}" if prefix.endswith("layers.") else rest
    return None


def test_the_config_class_defaults_are_4x_and_a_tied_head():
    """MiniCPMOcrConfig: downsample_mode "4x", tie_word_embeddings True (configuration_minicpm_ocr.py)."""
    spec = resolve_model(str(CUT))
    v = spec.vision
    assert (v.model_type, v.family, v.downsample_mode, v.window_merger) == ("minicpm_ocr", "minicpmv4_6", "4x", False)
    assert v.early_layers == v.depth == 2
    assert v.idle_params == v.vit_merger_params == v.unused_params > 0
    assert {x.part for x in v.linears() if x.name.startswith("vit_merger.")} == {"idle"}
    assert spec.tie_word_embeddings is True


@pytest.mark.torch
def test_parts_and_linears_equal_the_meta_model():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    model = meta_image_text_model(json.loads(CUT.read_text()))
    assert type(model).__name__ == "MiniCPMOcrForConditionalGeneration"
    assert model.config.downsample_mode == "4x"
    spec = resolve_model(str(CUT))
    count = meta_part_counts(model, tower=".vision_tower.", merger=".merger.")
    assert count == {"tower": spec.vision.tower_params, "merger": spec.vision.merger_params,
                     "language": spec.num_params}
    idle = sum(p.numel() for n, p in model.named_parameters() if ".vit_merger." in n)
    assert idle == spec.vision.idle_params
    linears = {_vision_name(n): (m.in_features, m.out_features) for n, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and _vision_name(n)}
    ours = {(f"blocks.{i}.{x.name}" if x.part == "tower" else x.name): (x.in_features, x.out_features)
            for x in spec.vision.linears() for i in range(x.count)}
    assert linears == ours
    assert spec.tie_word_embeddings is (model.get_output_embeddings().weight is model.get_input_embeddings().weight)
    assert spec.learned is not None


@pytest.mark.torch
def test_the_window_merger_gets_no_gradient_at_4x():
    """A real forward and backward of the cut's tower and merger (random weights, fp32, one 448 × 448 image through
    the processor): every vit_merger parameter's grad stays None (no gradient buffer, no AdamW state), every other
    tower and merger parameter gets one — what the spec's idle part says."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from PIL import Image
    from transformers import AutoConfig, AutoModelForImageTextToText

    from hpcmem.trace.vision import processor

    cfg = json.loads(CUT.read_text())
    cfg["text_config"] = {**cfg["text_config"], "hidden_size": 64, "intermediate_size": 64, "vocab_size": 512,
                          "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
                          "linear_num_key_heads": 2, "linear_num_value_heads": 2}
    cfg["vision_config"] = {**cfg["vision_config"], "hidden_size": 64, "intermediate_size": 128,
                            "num_attention_heads": 2}
    model = AutoModelForImageTextToText.from_config(AutoConfig.for_model(**cfg), dtype=torch.float32)
    out = processor(_job(448, 448))(text=["<unk_image> t3"], images=[[Image.new("RGB", (448, 448))]],
                                    return_tensors="pt")
    feats = model.model.get_image_features(pixel_values=out["pixel_values"], target_sizes=out["target_sizes"])
    rows = feats.pooler_output if hasattr(feats, "pooler_output") else feats
    torch.cat([r.reshape(-1) for r in (rows if isinstance(rows, (list, tuple)) else [rows])]).sum().backward()
    grads = {n: p.grad is not None for n, p in model.named_parameters() if ".vision_tower." in n or ".merger." in n}
    assert grads and not any(g for n, g in grads.items() if ".vit_merger." in n)
    assert all(g for n, g in grads.items() if ".vit_merger." not in n)


@pytest.mark.torch
def test_peft_all_linear_reaches_what_the_spec_adapts():
    pytest.importorskip("torch")
    pytest.importorskip("peft")

    model = meta_image_text_model(json.loads(CUT.read_text()))
    targets = peft_all_linear_targets(model)
    theirs = sorted(n for n in (_vision_name(t) for t in targets) if n)
    job = _job(448, 448, use_peft=True, lora_target_modules="all-linear")
    ours = sorted(f"blocks.{i}.{x.name}" if x.part == "tower" else x.name
                  for x in vision_adapters(job, job.model.vision) for i in range(x.count))
    assert theirs == ours
    assert "lm_head" not in targets


@pytest.mark.torch
@pytest.mark.parametrize(("height", "width", "tokens"), [(448, 448, 196), (672, 896, 960), (300, 1200, None),
                                                         (1500, 500, None), (100, 100, None)])
def test_the_processor_counts_the_spec_s_image_tokens(height, width, tokens):
    """MiniCPMOcrProcessor (hpcmem.trace.vision `processor`, transformers' own class) on one image: its image tokens,
    pixel columns, slices and the tokens around them are the spec's and `markers`'; at 448 × 448 one 28 × 28 slice
    (784 patches / 4 = 196 tokens), at 896 × 672 the 24 × 32 source and 2 × 2 slices of 24 × 32 (3,840 / 4 = 960)."""
    pytest.importorskip("transformers")
    from PIL import Image
    from transformers.models.minicpm_ocr.processing_minicpm_ocr import MiniCPMOcrProcessor

    from hpcmem.trace.vision import processor
    from hpcmem.trace.vision_minicpmv4_6 import markers

    job = _job(height, width)
    proc = processor(job)
    assert isinstance(proc, MiniCPMOcrProcessor) and proc.image_token_divisor == 4
    out = proc(text=[proc.image_token + " t3"], images=[[Image.new("RGB", (width, height))]], return_tensors="pt")
    g = image_geometry(job.train, job.model.vision)
    ids = out["input_ids"][0]
    assert int((ids == proc.image_token_id).sum()) == g.tokens
    assert out["pixel_values"].shape[-1] == g.patches * job.model.vision.patch_size
    assert tuple(map(tuple, out["target_sizes"].tolist())) == job.model.vision.slices(height, width)
    assert len(ids) == g.tokens + markers(job) + 1
    if tokens is not None:
        assert g.tokens == tokens


def test_adaptive_small_image_upsizing_is_refused():
    cfg = {**json.loads(CUT.read_text()), "small_image_upsize": "adaptive"}
    with pytest.raises(SpecError, match="small_image_upsize 'adaptive' is not modelled"):
        minicpm_ocr_tower_from_config(cfg, "cut")


def test_16x_on_minicpm_ocr_runs_the_window_merger():
    """A minicpm_ocr config that names downsample_mode "16x" runs 4.6's full pipeline (the window merger after
    insert_layer_id, which must then name a layer of the tower)."""
    cfg = {**json.loads(CUT.read_text()), "downsample_mode": "16x"}
    with pytest.raises(SpecError, match="insert_layer_id 6 must name one of the tower's 2 layers"):
        minicpm_ocr_tower_from_config(cfg, "cut")
    v = minicpm_ocr_tower_from_config({**cfg, "insert_layer_id": 0}, "cut")
    assert v.window_merger and v.idle_params == 0 and v.image_tokens(448, 448) == 49
